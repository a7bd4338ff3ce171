# drover — the usual entry points. Each target installs what it needs first.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/cartpole_dqn.yaml

.PHONY: install install-browser install-fuse run docs test test-fast test-full test-engine lint format bench bench-learning bench-selfplay bench-chaos bench-learner bench-atari bench-atari-collect bench-atari-learner bench-fleet bench-headline bench-parity bench-soak bench-fairness bench-scaling up down clean

# The stamp is refreshed whenever pyproject.toml changes, so `make test` on a fresh
# clone installs once and later runs start at once.
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/drover run $(CONFIG)

# The dashboard's browser test (tests/service/test_dashboard.py, marker browser) drives
# chromium through playwright. This installs the distribution's chromium package with
# apt-get when none is on PATH (root on Debian or Ubuntu), saying so; where it cannot,
# it says that instead, and the browser test is skipped.
install-browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then \
		echo "install-browser: chromium is installed (the dashboard's browser test drives it)"; \
	else \
		echo "install-browser: installing chromium (apt-get) for the dashboard's browser test"; \
		apt-get install -y -q --no-install-recommends chromium \
			|| (apt-get update -q && apt-get install -y -q --no-install-recommends chromium) \
			|| echo "install-browser: chromium could not be installed; the browser test will be skipped"; \
	fi

# The slow-volume tests (tests/slow_volume.py) mount a FUSE pass-through through fusepy,
# which loads libfuse 2. This installs the distribution's libfuse2 package with apt-get
# when the library is missing (root on Debian or Ubuntu), saying so; where it cannot,
# it says that instead, and those tests are skipped. (Mounting needs root too.)
FUSE_PACKAGE ?= libfuse2
install-fuse:
	@if PATH="$$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2 '; then \
		echo "install-fuse: libfuse2 is installed (the slow-volume tests mount through it)"; \
	else \
		echo "install-fuse: installing $(FUSE_PACKAGE) (apt-get) for the slow-volume tests"; \
		apt-get install -y -q --no-install-recommends $(FUSE_PACKAGE) \
			|| (apt-get update -q && apt-get install -y -q --no-install-recommends $(FUSE_PACKAGE)) \
			|| echo "install-fuse: $(FUSE_PACKAGE) could not be installed; the slow-volume tests will be skipped"; \
	fi

# The documentation site (mkdocs.yml) at http://127.0.0.1:8008, rebuilt as its pages
# change; `make test` builds it strictly (tests/unit/test_docs_site.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8008

# The whole suite, as CI runs it (.ci/run), but the soak (long) and tests/engine.
test: install install-browser install-fuse
	$(BIN)/pytest -q

# A few minutes (markers in pyproject.toml): every test that starts no real process,
# and one short job per workflow through real processes (the smoke). Nothing trains to a
# threshold, kills processes or drives a browser.
test-fast: install
	$(BIN)/pytest -q -m '(not processes and not learning and not chaos and not browser and not long and not engine) or smoke'

# The images built and run on a real Docker engine: compose and --backend docker train
# the default job (tests/engine), and Prometheus scrapes them. Starts a private dockerd
# when none is reachable (root) and stops it at the end; the images stay cached in its
# data root.
test-engine: install
	@command -v dockerd >/dev/null && command -v debootstrap >/dev/null && command -v docker-compose >/dev/null \
		&& command -v promtool >/dev/null \
		|| { echo "installing Debian's docker.io, debootstrap, docker-compose and prometheus"; \
		     apt-get install -y --no-install-recommends docker.io debootstrap docker-compose prometheus >/dev/null; }
	$(BIN)/pytest -q -s --durations=0 -m engine tests/engine

# Everything, the tests marked long included (the 10-minute soak).
test-full: install install-browser install-fuse
	$(BIN)/pytest -q -m 'not engine'

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The fast benches (about 10 minutes): throughput (a collector against its envs and
# inference alone, a learner fed through the services against in-memory batches), the
# whole `drover run` against one stable-baselines3 process (the `sb3` extra; without it
# drover's side alone), every process's memory, time to goal, the replay buffer, one
# call to a service.
bench: install
	$(BIN)/python bench/collector.py
	$(BIN)/python bench/learner_feed.py
	$(BIN)/python bench/whole_run.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/time_to_goal.py
	$(BIN)/python bench/buffer.py
	$(BIN)/python bench/service_client.py

# drover against stable-baselines3 on MuJoCo (examples/mujoco/, RL Zoo's settings): SAC on
# Hopper-v5 and HalfCheetah-v5, 3 seeds a side, 50,000 env steps each (about an hour a
# row on 2 cores); `--budget`, `--seeds` for RL Zoo's full budgets on a bigger box.
bench-parity: install
	$(BIN)/pip install -q -e '.[sb3,mujoco]'
	$(BIN)/python bench/parity.py --json bench/results/parity.json

bench-learning: install
	$(BIN)/python bench/learning.py

# Self-play: Connect Four and tic-tac-toe through the services, then their policies
# against random, heuristic and minimax players (about 5 minutes)
bench-selfplay: install
	$(BIN)/python bench/selfplay.py

bench-chaos: install
	$(BIN)/python bench/chaos.py --seeds 10 --stays-full 2

bench-learner: install
	$(BIN)/python bench/learner_scaling.py

# Pong from pixels to the end of its budget: hours on a GPU machine.
bench-atari: install
	$(BIN)/python bench/atari_learning.py --algo impala

bench-atari-collect: install
	$(BIN)/python bench/atari_collect.py

bench-atari-learner: install
	$(BIN)/python bench/atari_learner.py

# One coordinator under 8 to 128 simulated collectors and 4 learners (a few minutes),
# then the 64-collector row again under py-spy.
bench-fleet: install
	$(BIN)/python bench/fleet.py

# The README's performance table, from the benches themselves (about 12 minutes).
bench-headline: install
	$(BIN)/python bench/headline.py run
	$(BIN)/python bench/headline.py render

# The coordinator for 10 minutes under collectors, learners, job churn and two kill -9s.
bench-soak: install
	$(BIN)/python bench/soak.py

# Several jobs on one cluster: each one's share of the collectors and env steps
# against what it is owed, a newcomer's wait, priorities (about 6 minutes).
bench-fairness: install
	$(BIN)/python bench/fairness.py

# Strong scaling on an env whose step takes 10 ms: DQN, PPO, 1 to 32 collectors (about 25 min).
bench-scaling: install
	$(BIN)/python bench/scaling.py --out runs/bench-scaling --json bench/results/scaling.json

up:
	docker compose up --build

down:
	docker compose down -v

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
