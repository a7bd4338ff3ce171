// drover's dashboard: plain JS, no libraries, no build step. It reads the coordinator's
// /api/v1 routes with the token kept in sessionStorage and redraws every 2 seconds.
"use strict";

const API = "/api/v1";
const TOKEN_KEY = "drover.token";
const REFRESH_MS = 2000;
// A request not answered in this time fails, so one lost answer cannot stop the redraws
// for good (a refresh waits for the one before it).
const FETCH_TIMEOUT_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";

let timer = null;
let busy = false;
let again = false; // a refresh asked for while one was under way (a click)

// --- small helpers ------------------------------------------------------------------

// An element with attributes and children (strings become text: never parsed as HTML).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

// A text label appended to the SVG element `parent`.
function svgText(parent, x, y, text, anchor = "middle", attrs = {}) {
  const t = svg("text", { x, y, "text-anchor": anchor, ...attrs });
  t.textContent = text;
  parent.append(t);
}

function fmt(x, digits = 1) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(2) + "M";
  if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(1) + "k";
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}

function age(seconds) {
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

// --- auth and API -------------------------------------------------------------------

class AuthError extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path) {
  let resp;
  try {
    resp = await fetch(API + path, {
      headers: { Authorization: "Bearer " + token() },
      cache: "no-store",
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
  } catch (err) {
    if (err.name === "TimeoutError") throw new Error(`${path}: no answer in ${FETCH_TIMEOUT_MS / 1000} s`);
    throw err;
  }
  let data = null;
  try {
    data = await resp.json();
  } catch (_) {
    data = null;
  }
  if (resp.status === 401 || resp.status === 403) {
    const why = data && data.message ? data.message : resp.statusText;
    throw new AuthError(`The token was refused (${resp.status}): ${why}`);
  }
  if (!resp.ok) {
    const why = data && data.message ? data.message : resp.statusText;
    throw new Error(`${path}: ${resp.status} ${why}`);
  }
  return data;
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function showLogin(message) {
  stop();
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("view").replaceChildren();
  document.getElementById("login").hidden = false;
  document.getElementById("logout").hidden = true;
  document.getElementById("updated").textContent = "";
  showError(message);
  document.getElementById("token").focus();
}

// --- charts: inline SVG ---------------------------------------------------------------

// A line chart of points [{x, y}]; `id` names it for tests (data-points: how many).
function lineChart(id, title, points, xLabel, yLabel) {
  const W = 480, H = 220, L = 52, R = 12, T = 24, B = 34;
  const box = el("div", { class: "chart", id, "data-points": points.length });
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  const label = (x, y, text, anchor = "middle") => svgText(s, x, y, text, anchor);
  label(L, 14, title, "start");
  s.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  s.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  label((L + W - R) / 2, H - 6, xLabel);
  if (points.length === 0) {
    label((L + W - R) / 2, (T + H - B) / 2, "no data yet");
    box.append(s);
    return box;
  }
  const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(0, ...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + 1;
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  label(L - 4, py(y1) + 4, fmt(y1), "end");
  label(L - 4, py(y0) + 4, fmt(y0), "end");
  label(px(x0), H - B + 14, fmt(x0));
  label(px(x1), H - B + 14, fmt(x1), "end");
  svgText(s, 12, (T + H - B) / 2, yLabel, "middle", { transform: `rotate(-90 12 ${(T + H - B) / 2})` });
  const d = points.map((p, i) => `${i ? "L" : "M"}${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`);
  s.append(svg("path", { class: "line", d: d.join(" ") }));
  if (points.length <= 60) {
    for (const p of points) s.append(svg("circle", { class: "dot", cx: px(p.x), cy: py(p.y), r: 2.5 }));
  }
  box.append(s);
  return box;
}

// Bars for a histogram: entry i is the count at i (the last: that many or more).
function barChart(id, title, counts, xLabel) {
  const W = 480, H = 160, L = 52, R = 12, T = 24, B = 30;
  const box = el("div", { class: "chart", id, "data-bars": counts.length });
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  svgText(s, L, 14, title, "start");
  s.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  const top = Math.max(1, ...counts);
  const w = (W - L - R) / Math.max(1, counts.length);
  counts.forEach((c, i) => {
    const h = (c / top) * (H - T - B);
    s.append(svg("rect", { class: "bar", x: L + i * w + 1, y: H - B - h, width: Math.max(1, w - 2), height: h }));
    if (counts.length <= 20 || i % Math.ceil(counts.length / 20) === 0) {
      svgText(s, L + i * w + w / 2, H - B + 12, i === counts.length - 1 ? `${i}+` : String(i));
    }
  });
  svgText(s, L - 4, T + 4, fmt(top), "end");
  svgText(s, (L + W - R) / 2, H - 4, xLabel);
  box.append(s);
  return box;
}

// --- views ----------------------------------------------------------------------------

function phase(p) {
  return el("span", { class: `phase phase-${p}` }, p);
}

// A job's share of one role's workers: held now of owed (its fair share), "–" for a job
// that is not running.
function heldOfOwed(share) {
  return share ? `${share.held} / ${share.owed.toFixed(2)}` : "–";
}

// Why a running or queued job waits ("" when it does not).
function waitsFor(j) {
  return j.phase === "running" || j.phase === "queued" ? j.reason : "";
}

async function jobsView() {
  const data = await api("/jobs");
  const rows = data.jobs
    .slice()
    .sort((a, b) => b.started_at - a.started_at)
    .map((j) =>
      el(
        "tr",
        { class: "job", "data-job-id": j.job_id, onclick: () => (location.hash = `#/jobs/${j.job_id}`) },
        el("td", {}, el("a", { href: `#/jobs/${j.job_id}` }, j.job_id)),
        el("td", {}, j.name),
        el("td", {}, j.algo),
        el("td", {}, j.env_id),
        el("td", {}, phase(j.phase), j.queue_position ? ` #${j.queue_position}` : ""),
        el("td", {}, String(j.priority)),
        el("td", { class: "share" }, heldOfOwed(j.collector_share)),
        el("td", {}, heldOfOwed(j.learner_share)),
        el("td", {}, fmt(j.env_steps)),
        el("td", {}, j.last_eval ? fmt(j.last_eval.return_mean, 2) : "–"),
        el("td", { class: "muted why" }, waitsFor(j)),
      ),
    );
  const headers = ["id", "name", "algo", "env", "phase", "priority", "collectors held / owed",
    "learner held / owed", "env steps", "last eval", "waiting for"];
  return [
    el("h1", {}, "Jobs"),
    rows.length
      ? el(
          "table",
          { id: "jobs" },
          el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
          el("tbody", {}, rows),
        )
      : el("p", { class: "muted", id: "no-jobs" }, "No jobs yet: submit one with `drover submit`."),
  ];
}

function card(label, value) {
  return el("div", { class: "card" }, el("span", { class: "muted" }, label), el("b", {}, value));
}

// A count against its budget (null: no budget), with how much of it is spent.
function budgetCard(label, value, budget) {
  if (budget === null || budget === undefined) return card(label, fmt(value));
  const spent = Math.min(value / budget, 1);
  return el(
    "div",
    { class: "card budget", "data-budget": label },
    el("span", { class: "muted" }, `${label} (budget)`),
    el("b", {}, `${fmt(value)} / ${fmt(budget)}`),
    el("progress", { max: "1", value: String(spent) }),
  );
}

async function jobView(jobId) {
  const id = encodeURIComponent(jobId);
  const [job, metrics] = await Promise.all([api(`/jobs/${id}`), api(`/jobs/${id}/metrics`)]);
  // A self-play job's league; other jobs have none (404).
  const league = await api(`/jobs/${id}/league`).catch(() => null);
  const returns = metrics.evals.map((e) => ({ x: e.env_steps, y: e.return_mean }));
  const pts = metrics.points;
  const rate = [];
  for (let i = 1; i < pts.length; i++) {
    const dt = pts[i].t - pts[i - 1].t;
    if (dt > 0) rate.push({ x: pts[i].t - pts[0].t, y: (pts[i].env_steps - pts[i - 1].env_steps) / dt });
  }
  const buf = metrics.buffer;
  const learners = job.learners.map((l) =>
    l.rank_devices.length ? `${l.worker_id} (${l.rank_devices.join(", ")})` : l.worker_id,
  );
  return [
    el("h1", {}, el("a", { href: "#/jobs" }, "Jobs"), " / ", job.name, " ", el("span", { class: "muted" }, job.job_id)),
    el(
      "div",
      { class: "cards" },
      card("phase", phase(job.phase)),
      card("algo / env", `${job.algo} / ${job.env_id}`),
      budgetCard("env steps", job.env_steps, job.max_env_step),
      budgetCard("train iters", job.train_iters, job.max_train_iter),
      card("policy version", String(job.policy_version)),
      card("last eval", job.last_eval ? fmt(job.last_eval.return_mean, 2) : "–"),
      card("best eval", job.best_eval_return === null ? "–" : fmt(job.best_eval_return, 2)),
      card("stop value", job.stop_value === null ? "–" : fmt(job.stop_value)),
      card("env steps/s", rate.length ? fmt(rate[rate.length - 1].y) : "–"),
      card("tasks failed / reassigned", `${job.task_failures} / ${job.tasks_reassigned}`),
      card("priority / share", `${job.priority} / ${fmt(job.share, 2)}`),
      job.queue_position ? card("queue position", String(job.queue_position)) : null,
      card("collectors held / owed", heldOfOwed(job.collector_share)),
      card("learner held / owed", heldOfOwed(job.learner_share)),
      card("tasks released for other jobs", String(job.tasks_preempted)),
    ),
    job.reason ? el("p", { class: "muted" }, job.reason) : null,
    job.storage_full_s === null || job.storage_full_s === undefined
      ? null
      : el(
          "p",
          { class: "error", id: "storage-full" },
          `The shared volume is full: this job's writes have waited ${fmt(job.storage_full_s)} s for room ` +
            "(it fails at system.storage_grace_s without progress).",
        ),
    el(
      "div",
      { class: "charts" },
      lineChart("return-chart", "Evaluation return (mean)", returns, "env steps", "return"),
      lineChart("throughput-chart", "Throughput", rate, "seconds since the first point", "env steps/s"),
    ),
    el("h2", {}, "Replay buffer"),
    el(
      "div",
      { class: "cards", id: "buffer" },
      card("size", `${fmt(buf.size)} / ${fmt(buf.capacity)}`),
      card("inserts", fmt(buf.inserts)),
      card("samples", fmt(buf.samples)),
      card("sampler", buf.sampler),
      card("staleness mean", fmt(buf.staleness_mean, 2)),
      card("samples per insert", fmt(buf.samples_per_insert_ratio, 2)),
    ),
    el(
      "div",
      { class: "charts" },
      barChart("lag-chart", "Sampled items by policy lag", buf.sampled_lag_histogram, "versions behind"),
    ),
    ...videoSection(jobId, metrics.evals),
    learners.length ? el("p", { class: "muted" }, "Learners: ", learners.join("; ")) : null,
    league ? leagueSection(league) : null,
  ];
}

// The newest evaluation video (policy.eval.video_every). Its element is kept across
// redraws, so that it plays on instead of starting again every refresh; its file comes
// through the API with the token (a <video src> could not send it).
const videos = new Map();

function videoSection(jobId, evals) {
  const recorded = evals.filter((e) => e.video);
  if (!recorded.length) {
    const failed = evals.find((e) => e.video_error);
    return failed ? [el("p", { class: "muted", id: "video-error" }, `No evaluation video: ${failed.video_error}`)] : [];
  }
  const last = recorded[recorded.length - 1];
  let video = videos.get(last.video);
  if (!video) {
    video = el("video", { id: "eval-video", controls: "", loop: "", playsinline: "" });
    video.muted = true;
    videos.set(last.video, video);
    const name = last.video.split("/").pop();
    fetch(`${API}/jobs/${encodeURIComponent(jobId)}/videos/${encodeURIComponent(name)}`, {
      headers: { Authorization: "Bearer " + token() },
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    })
      .then((resp) => (resp.ok ? resp.blob() : Promise.reject(new Error(`${resp.status}`))))
      .then((blob) => {
        video.src = URL.createObjectURL(blob);
        video.play().catch(() => {});
      })
      .catch((err) => {
        videos.delete(last.video); // tried again at the next refresh
        video.dataset.error = err.message;
      });
  }
  return [
    el("h2", {}, `Evaluation video: policy v${last.policy_version}, return ${fmt(last.return_mean, 1)}`),
    video,
  ];
}

// A self-play job's league: the policy's rating, its newest battle's win rates against
// the baselines, and each opponent with its rating and the policy's games against it.
function leagueSection(league) {
  const last = league.evaluations.length ? league.evaluations[league.evaluations.length - 1] : null;
  const rates = last
    ? Object.entries(last.win_rates).map(([name, rate]) => card(`win rate vs ${name} (v${last.policy_version})`, rate === null ? "–" : fmt(rate, 2)))
    : [];
  const rows = league.members.map((m) =>
    el(
      "tr",
      { class: "member" },
      el("td", {}, m.name),
      el("td", {}, m.kind),
      el("td", {}, fmt(m.ordinal, 1)),
      el("td", {}, `${fmt(m.wins)} / ${fmt(m.draws)} / ${fmt(m.losses)}`),
      el("td", {}, m.games ? fmt(m.win_rate, 2) : "–"),
      el("td", {}, fmt(m.pfsp_weight, 2)),
    ),
  );
  return el(
    "div",
    { id: "league" },
    el("h2", {}, "League"),
    el("div", { class: "cards" }, card("rating", fmt(league.main.ordinal, 1)), card("games", fmt(league.games)), rates),
    el(
      "table",
      {},
      el("thead", {}, el("tr", {}, ["opponent", "kind", "rating", "won / drawn / lost", "win rate", "pfsp weight"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows),
    ),
  );
}

async function workersView() {
  const data = await api("/workers");
  const rows = data.workers.map((w) => {
    const progress = Object.values(w.progress);
    const rate = (key) => progress.reduce((sum, p) => sum + (p[key] || 0), 0);
    const steps = w.role === "collector" ? `${fmt(rate("env_steps_per_s"))} env steps/s`
      : w.role === "learner" ? `${fmt(rate("samples_per_s"))} samples/s` : "–";
    return el(
      "tr",
      { class: "worker", "data-role": w.role },
      el("td", {}, w.worker_id),
      el("td", {}, w.role),
      el("td", {}, w.held_back_s > 0 ? `${w.state}, held back ${fmt(w.held_back_s)} s (${w.lost_tasks} lost)` : w.state),
      el("td", {}, w.task_ids.join(", ") || "–"),
      el("td", {}, progress.length ? steps : "–"),
      el("td", {}, age(w.last_heartbeat_s)),
    );
  });
  return [
    el("h1", {}, "Workers"),
    el(
      "table",
      { id: "workers" },
      el("thead", {}, el("tr", {}, ["id", "role", "state", "tasks", "steps/s", "last heartbeat"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows),
    ),
  ];
}

// --- experiments ----------------------------------------------------------------------------

function pointLabel(values) {
  const parts = Object.entries(values).map(([key, value]) => {
    const shown = typeof value === "number" && !Number.isInteger(value) ? value.toPrecision(4) : String(value);
    return `${key.split(".").pop()}=${shown}`;
  });
  return parts.join(", ") || "–";
}

function median(values) {
  const sorted = values.slice().sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

async function experimentsView() {
  const data = await api("/experiments");
  const rows = data.experiments.map((e) => {
    return el(
      "tr",
      { class: "experiment", onclick: () => (location.hash = `#/experiments/${e.experiment_id}`) },
      el("td", {}, el("a", { href: `#/experiments/${e.experiment_id}` }, e.experiment_id)),
      el("td", {}, e.name),
      el("td", {}, phase(e.phase)),
      el("td", {}, `${e.jobs_ended} of ${e.jobs}`),
      el("td", {}, e.parallel === null ? "–" : String(e.parallel)),
    );
  });
  return [
    el("h1", {}, "Experiments"),
    rows.length
      ? el(
          "table",
          { id: "experiments" },
          el("thead", {}, el("tr", {}, ["id", "name", "phase", "jobs ended", "at once"].map((h) => el("th", {}, h)))),
          el("tbody", {}, rows),
        )
      : el("p", { class: "muted" }, "No experiments yet: run one with `drover sweep`."),
  ];
}

async function experimentView(experimentId) {
  const e = await api(`/experiments/${encodeURIComponent(experimentId)}`);
  // Each point of the sweep over its seeds: the final returns' median and range.
  const points = new Map();
  for (const m of e.members) {
    const label = pointLabel(m.values);
    if (!points.has(label)) points.set(label, []);
    points.get(label).push(m);
  }
  const summary = [...points.entries()].map(([label, members]) => {
    const finals = members.filter((m) => m.last_eval_return !== null).map((m) => m.last_eval_return);
    const succeeded = members.filter((m) => m.phase === "succeeded").length;
    return el(
      "tr",
      { class: "point" },
      el("td", {}, label),
      el("td", {}, String(members.length)),
      el("td", {}, `${succeeded}/${members.length}`),
      el("td", {}, finals.length ? fmt(median(finals), 1) : "–"),
      el("td", {}, finals.length ? `${fmt(Math.min(...finals), 1)} – ${fmt(Math.max(...finals), 1)}` : "–"),
    );
  });
  // A tuning's members are its trials: how each ended (pruned shows here) and its objective.
  const tuning = e.tuning !== null && e.tuning !== undefined;
  const trialCells = (m) =>
    tuning
      ? [
          el("td", {}, String(m.trial)),
          el("td", { class: `trial-${m.trial_state || "running"}` }, m.trial_state || "running"),
          el("td", {}, m.objective === null ? "–" : fmt(m.objective, 4)),
        ]
      : [];
  const jobs = e.members.map((m) =>
    el(
      "tr",
      { class: "member", onclick: () => (location.hash = `#/jobs/${m.job_id}`) },
      el("td", {}, el("a", { href: `#/jobs/${m.job_id}` }, m.job_id)),
      ...trialCells(m),
      el("td", {}, pointLabel(m.values)),
      el("td", {}, String(m.seed)),
      el("td", {}, phase(m.phase)),
      el("td", {}, fmt(m.env_steps)),
      el("td", {}, m.last_eval_return === null ? "–" : fmt(m.last_eval_return, 1)),
      el("td", {}, m.best_eval_return === null ? "–" : fmt(m.best_eval_return, 1)),
    ),
  );
  const memberHeaders = ["job", ...(tuning ? ["trial", "trial ended", "objective"] : []), "point", "seed", "phase", "env steps", "last eval", "best eval"];
  const table = (id, headers, rows) =>
    el("table", { id }, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
  return [
    el("h1", {}, el("a", { href: "#/experiments" }, "Experiments"), " / ", e.name, " ", el("span", { class: "muted" }, e.experiment_id)),
    el("div", { class: "cards" }, card("phase", phase(e.phase)), card("jobs", String(e.members.length)),
      card("at once", e.parallel === null ? "–" : String(e.parallel))),
    el("h2", {}, "Points"),
    table("points", ["point", "runs", "succeeded", "final return, median", "final return, range"], summary),
    el("p", { class: "muted" }, "Medians and IQMs with 95% confidence intervals, curves and a performance profile: drover report <run folder>."),
    el("h2", {}, "Jobs"),
    ...(tuning ? [el("p", { class: "muted" }, `A tuning: ${e.tuning.n_trials || 20} trials, ${e.tuning.n_parallel || 1} at once, by ${e.tuning.objective || "env_steps_to_stop"}; the best config: drover tune writes best.yaml.`)] : []),
    table("members", memberHeaders, jobs),
    ...lineageView(e),
  ];
}

// A population's steps (population-based training): who took whose checkpoint, when.
function lineageView(e) {
  if (!e.population) return [];
  const steps = e.lineage.slice().reverse().map((s) =>
    el(
      "tr",
      { class: "step" },
      el("td", {}, fmt(s.env_steps)),
      el("td", {}, el("a", { href: `#/jobs/${s.job_id}` }, s.job_id), ` (${fmt(s.eval_return, 1)})`),
      el("td", {}, el("a", { href: `#/jobs/${s.donor_id}` }, s.donor_id), ` (${fmt(s.donor_return, 1)})`),
      el("td", {}, s.checkpoint || "– (explored only)"),
      el("td", {}, pointLabel(s.before), " → ", pointLabel(s.after)),
    ),
  );
  const p = e.population;
  return [
    el("h2", {}, `Population steps (${e.lineage.length})`),
    el("p", { class: "muted" }, `Every ${p.ready} evaluations of a member, the bottom ${p.quantile * 100}% take a top member's newest checkpoint and perturb ${p.params.join(", ")} by ${p.perturb.join(" or ")}. Plotted by drover report (lineage.png).`),
    steps.length
      ? el("table", { id: "lineage" },
          el("thead", {}, el("tr", {}, ["env steps", "member (return)", "took from (return)", "checkpoint", "hyperparameters"].map((h) => el("th", {}, h)))),
          el("tbody", {}, steps))
      : el("p", { class: "muted" }, "No steps yet."),
  ];
}

// --- routing and refresh -----------------------------------------------------------------

function route() {
  const hash = location.hash || "#/jobs";
  const job = hash.match(/^#\/jobs\/(.+)$/);
  if (job) return { nav: "nav-jobs", render: () => jobView(decodeURIComponent(job[1])) };
  if (hash === "#/workers") return { nav: "nav-workers", render: workersView };
  const experiment = hash.match(/^#\/experiments\/(.+)$/);
  if (experiment) return { nav: "nav-experiments", render: () => experimentView(decodeURIComponent(experiment[1])) };
  if (hash === "#/experiments") return { nav: "nav-experiments", render: experimentsView };
  return { nav: "nav-jobs", render: jobsView };
}

async function refresh() {
  if (!token()) return;
  if (busy) {
    again = true;
    return;
  }
  busy = true;
  const current = location.hash;
  const { nav, render } = route();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.id === nav);
  try {
    const nodes = await render();
    if (location.hash === current) {
      document.getElementById("view").replaceChildren(...nodes.filter((n) => n !== null));
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      showError("");
    }
  } catch (err) {
    if (err instanceof AuthError) showLogin(err.message);
    else showError(err.message);
  } finally {
    busy = false;
    if (again) {
      again = false;
      refresh();
    }
  }
}

function start() {
  document.getElementById("login").hidden = true;
  document.getElementById("logout").hidden = false;
  stop();
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

function stop() {
  if (timer !== null) clearInterval(timer);
  timer = null;
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  showError("");
  start();
});
document.getElementById("logout").addEventListener("click", () => showLogin(""));
window.addEventListener("hashchange", () => {
  if (token()) {
    document.getElementById("view").replaceChildren();
    refresh();
  }
});

// A link that signs in (what `drover run` prints): `#token=...`, in the fragment so it
// never reaches a server's log. The token is kept as a typed one is, and the address
// bar loses it (nor does the browser's history keep it).
const signIn = location.hash.match(/^#token=([^&]+)/);
if (signIn) {
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(signIn[1]));
  history.replaceState(null, "", location.pathname + location.search + "#/jobs");
}

if (token()) start();
else showLogin("");
