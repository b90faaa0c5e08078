// Runs `seeds` and a 5-step `mlp-train` on the page's WebGPU in headless Chromium (Dawn on its
// bundled SwiftShader where there is no GPU) and checks them against native runs made by
// scripts/dev/test-web.sh:
//
// - the marks equal the native wgpu run's (`cachalot run --backend wgpu`, on lavapipe here);
// - the losses equal the CPU reference's (`--backend sim --profile wgpu`) within 1e-4 relative;
// - the allocator's events equal the simulator's with the wgpu profile, entry for entry once
//   addresses are made (segment, offset) as `cachalot_trace::normalized` does;
// - a screenshot after the run shows the segment map with segments in it;
// - the page's Compare tab, given seeds.expected.json, shows the marks table and names the
//   reasons `cachalot compare` gives for the native wgpu run;
// - GPU faults (a validation error, the device lost; during and after runs) are shown, and the
//   page runs again without a reload.
//
// With CACHALOT_REQUIRE_GPU=1 a page without a WebGPU adapter fails; otherwise it is reported
// and the WebGPU checks are skipped (never counted as passed).
//
//   node webgpu.mjs http://127.0.0.1:8765/ REFS_DIR out.png
import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { chromium, firefox } from "playwright-core";
import { checkHealthy, gotoViewer, launchChromium, openViewer } from "./chromium.mjs";

const [base, refs, shot] = process.argv.slice(2);
if (!base || !refs || !shot) {
  console.error("usage: node webgpu.mjs BASE_URL REFS_DIR SCREENSHOT.png");
  process.exit(2);
}
const requireGpu = (process.env.CACHALOT_REQUIRE_GPU || "0") !== "0";

// Debian's Firefox ESR through WebDriver BiDi (playwright's `moz-firefox` channel; its own
// patched Firefox is not needed), with WebGPU turned on; its WebGPU runs on Vulkan (Mesa's
// lavapipe without a GPU).
const launchFirefox = () =>
  firefox.launch({
    channel: "moz-firefox",
    executablePath: process.env.FIREFOX || "/usr/bin/firefox-esr",
    headless: true,
    firefoxUserPrefs: { "dom.webgpu.enabled": true, "gfx.webgpu.ignore-blocklist": true },
  });

const failures = [];
const checkIn = (ok, message) => {
  if (!ok) failures.push(message);
  console.log(`${ok ? "ok  " : "FAIL"} ${message}`);
};

// The command line (test-web.sh passes its path), for reading the page's downloads back.
const cli = (args) => {
  try {
    return { ok: true, out: execFileSync(process.env.CACHALOT || "cachalot", args, { stdio: ["ignore", "pipe", "pipe"] }).toString() };
  } catch (error) {
    return { ok: false, err: `${error.message.split("\n")[0]} ${String(error.stderr || "").slice(0, 300)}` };
  }
};

// `cachalot compare EXPECTED RUN`: its exit status, the rows of its marks table and its
// `reason:` lines, with the run's file name replaced by "B" so two runs' outputs compare.
const compare = (expected, run) => {
  const done = spawnSync(process.env.CACHALOT || "cachalot", ["compare", expected, run], { encoding: "utf8" });
  const text = (done.stdout || "").replaceAll(run.split("/").pop(), "B");
  const lines = text.split("\n");
  const start = lines.findIndex((l) => l.startsWith("marks:"));
  const end = lines.findIndex((l, i) => i > start && l.trim() === "");
  return {
    status: done.status,
    marks: start < 0 ? [] : lines.slice(start + 2, end),
    reasons: lines.filter((l) => l.trim().startsWith("reason:")),
  };
};

const snapshot = (name) => JSON.parse(readFileSync(`${refs}/${name}`, "utf8"));
const record = (snap) => {
  const entry = snap.device.details.find(([key]) => key === "cachalot.run");
  return entry ? JSON.parse(entry[1]) : null;
};
const marksOf = (snap) => snap.marks.map((m) => `${m.label} ${m.allocated} ${m.reserved}`);

// `cachalot_trace::normalized::normalize`: addresses as (segment in creation order, offset);
// runs of segment_free entries in segment order.
const normalize = (trace) => {
  const live = [];
  let next = 0;
  const out = [];
  for (const e of trace) {
    const action = String(e.action);
    const addr = BigInt(e.addr);
    const size = BigInt(e.size);
    const find = () => live.findIndex(([b, s]) => addr >= b && addr < b + (s > 0n ? s : 1n));
    let segment = null;
    let offset = 0n;
    if ((action === "segment_alloc" || action === "segment_map") && find() < 0) {
      live.push([addr, size, next]);
      segment = next++;
    } else if (action === "oom" || action === "snapshot") {
      segment = null;
    } else {
      const i = find();
      if (i >= 0) {
        const [b, , index] = live[i];
        if (action === "segment_free") live.splice(i, 1);
        segment = index;
        offset = addr - b;
      } else {
        offset = addr;
      }
    }
    out.push({ action, size, stream: String(e.stream), segment, offset });
  }
  for (let start = 0; start < out.length; ) {
    let end = start;
    while (end < out.length && out[end].action === "segment_free") end++;
    const run = out.slice(start, end).sort((x, y) => (x.segment - y.segment) || (x.size < y.size ? -1 : x.size > y.size ? 1 : 0));
    out.splice(start, run.length, ...run);
    start = Math.max(end, start + 1);
  }
  return out.map((e) => `${e.action} ${e.size} s${e.stream} @${e.segment}+${e.offset}`);
};
const firstDifference = (a, b) => {
  const n = Math.max(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return `entry ${i}: ${a[i]} vs ${b[i]}`;
  return null;
};

// GPU errors are shown, never swallowed, and the page stays usable without a reload: a
// validation error during a run and after it, the device lost while idle and during a run
// (`inject_gpu_fault`: an invalid buffer; `GPUDevice.destroy()`), each followed by runs that
// work (on a new device the page requests by itself, and on the simulator).
const gpuFaults = async (page, check, run, gpu, errors) => {
  const wait = (f, arg, timeout = 60000) => page.waitForFunction(f, arg, { timeout, polling: 100 });
  const logged = errors.length;
  const ready = () => wait(() => JSON.parse(window.cachalot.gpu_status()).adapter.state === "ready", null, 120000);
  const untilStopped = async () => {
    try {
      await wait(() => !JSON.parse(window.cachalot.gpu_status()).run.running, null, 90000);
      return true;
    } catch {
      await page.evaluate(() => window.cachalot.stop_gpu_run());
      await wait(() => !JSON.parse(window.cachalot.gpu_status()).run.running);
      return false;
    }
  };
  const long = { experiment: "mlp-train", backend: "webgpu", steps: 1000, budget_mib: 2048 };
  const started = () => wait(() => JSON.parse(window.cachalot.gpu_status()).run.marks >= 2, null, 120000);

  // A validation error during a run: the run's errors name it, the run goes on to its end.
  await page.evaluate((s) => window.cachalot.run_on_gpu(JSON.stringify(s)), { ...long, steps: 6 });
  await started();
  await page.evaluate(() => window.cachalot.inject_gpu_fault("validation"));
  const ended = await untilStopped();
  let status = await gpu();
  const during = status.run.device_errors.join(" | ");
  check(ended && status.run.result && status.run.result.record.error === null, `a validation error during a run: the run still finishes (${status.run.result && status.run.result.record.error})`);
  check(/WebGPU error/.test(during) && /usage/i.test(during), `a validation error during a run is shown with the run (${during.slice(0, 200)})`);

  // A validation error while no run is going: the window shows it.
  await page.evaluate(() => window.cachalot.inject_gpu_fault("validation"));
  await wait(() => JSON.parse(window.cachalot.gpu_status()).gpu_errors.length > 0, null, 30000).catch(() => {});
  status = await gpu();
  const idle = status.gpu_errors.join(" | ");
  check(/WebGPU error/.test(idle) && /usage/i.test(idle), `a validation error after a run is shown in the window (${idle.slice(0, 200)})`);

  // The device lost while idle: shown, a new device is requested, and a run works on it.
  await page.evaluate(() => window.cachalot.inject_gpu_fault("device-loss"));
  await wait(() => JSON.parse(window.cachalot.gpu_status()).gpu_errors.some((e) => e.includes("device lost")), null, 30000).catch(() => {});
  status = await gpu();
  const lost = status.gpu_errors.filter((e) => e.includes("device lost")).join(" | ");
  check(lost.length > 0, `the device's loss is shown (${lost.slice(0, 200) || status.gpu_errors.join(" | ")})`);
  await ready();
  {
    const { status, snap } = await run({ experiment: "seeds", backend: "webgpu", budget_mib: 2048 });
    const d = firstDifference(marksOf(snap), marksOf(snapshot("seeds.wgpu.json")));
    check(status.run.result.record.error === null && d === null, `after the device was lost, seeds runs on a new WebGPU device with the native marks${d ? ": " + d : ""}`);
  }

  // The device lost during a run: the run ends with a readable error instead of hanging,
  // and the page runs again.
  const lostBefore = (await gpu()).gpu_errors.filter((e) => e.includes("new one is being requested")).length;
  await page.evaluate((s) => window.cachalot.run_on_gpu(JSON.stringify(s)), long);
  await started();
  await page.evaluate(() => window.cachalot.inject_gpu_fault("device-loss"));
  const endedByItself = await untilStopped();
  status = await gpu();
  const withRun = status.run.device_errors.filter((e) => e.includes("device lost")).join(" | ");
  check(endedByItself && status.run.marks < 1000, `a run whose device is lost ends by itself (after ${status.run.marks} marks: ${status.run.result && status.run.result.record.error})`);
  check(withRun.length > 0, `the run says its device was lost (${withRun || status.run.device_errors.join(" | ")})`);
  // Then (the run over) the window says a new device is being requested, and gets one.
  await wait((n) => {
    const s = JSON.parse(window.cachalot.gpu_status());
    return s.gpu_errors.filter((e) => e.includes("new one is being requested")).length > n;
  }, lostBefore, 30000).catch(() => {});
  status = await gpu();
  check(status.gpu_errors.filter((e) => e.includes("new one is being requested")).length > lostBefore, "the window says a new device is being requested");
  await ready();
  {
    const { status } = await run({ experiment: "mlp-train", backend: "webgpu", steps: 2, budget_mib: 2048 });
    check(status.run.result.record.error === null, `after a loss during a run, the next WebGPU run works (${status.run.result.record.error})`);
    const sim = await run({ experiment: "seeds", backend: "sim", budget_mib: 2048 });
    const d = firstDifference(marksOf(sim.snap), marksOf(snapshot("seeds.sim-wgpu.json")));
    check(sim.status.run.result.record.error === null && d === null, `and a simulator run works${d ? ": " + d : ""}`);
  }
  const panicked = await page.evaluate(() => window.cachalot.has_panicked());
  check(!panicked, "after the GPU faults the app did not panic");
  // What the console got meanwhile is the page's report of those errors, nothing else.
  const other = errors.slice(logged).filter((e) => !/WebGPU|device|lost|destroyed|usage|GPU/i.test(e));
  check(other.length === 0, `no other console errors during the GPU faults${other.length ? ": " + other.join(" | ") : ""}`);
};

// One browser's checks; `full` adds the OOM, the run after it and the screenshot.
const session = async (name, browser, full) => {
  const check = (ok, message) => checkIn(ok, `${name}: ${message}`);
  try {
  const { page, errors } = await openViewer(browser, base);
  const gpu = async () => JSON.parse(await page.evaluate(() => window.cachalot.gpu_status()));
  const adapter = (await gpu()).adapter;
  console.log(`${name}: adapter: ${JSON.stringify(adapter)}`);
  if (adapter.state !== "ready" && name === "chromium") {
    check(!requireGpu, `a WebGPU adapter (CACHALOT_REQUIRE_GPU=1): ${adapter.why}`);
    if (!requireGpu) console.log("SKIP the WebGPU checks: no adapter, and CACHALOT_REQUIRE_GPU is unset");
  } else if (adapter.state !== "ready") {
    console.log(`SKIP ${name}: no WebGPU adapter here (${adapter.why})`);
  } else {
    const blank = full ? await page.screenshot({ clip: { x: 420, y: 300, width: 960, height: 520 } }) : null;
    const run = async (settings) => {
      await page.evaluate((s) => window.cachalot.run_on_gpu(JSON.stringify(s)), settings);
      const started = Date.now();
      // Frames go on while it runs: the page answers between readbacks.
      let frames = 0;
      await page.waitForFunction(
        () => {
          const s = JSON.parse(window.cachalot.gpu_status());
          return s.run && !s.run.running;
        },
        null,
        { timeout: 400000, polling: 100 },
      );
      frames = await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => done(1))));
      const status = await gpu();
      const snap = JSON.parse(await page.evaluate(() => window.cachalot.gpu_snapshot()));
      console.log(`${settings.experiment}: ${((Date.now() - started) / 1000).toFixed(1)} s, ${status.run.entries} events`);
      check(frames === 1, `${settings.experiment}: the page still draws frames after the run`);
      return { status, snap };
    };

    // seeds
    {
      const { status, snap } = await run({ experiment: "seeds", backend: "webgpu", budget_mib: 2048 });
      const result = status.run.result;
      check(result && result.record.error === null, `seeds on WebGPU finished (${result && result.record.error})`);
      check(result.record.outcome.checks.every((c) => c.passed), `seeds' checks passed: ${JSON.stringify(result.record.outcome.checks)}`);
      const native = snapshot("seeds.wgpu.json");
      const d = firstDifference(marksOf(snap), marksOf(native));
      check(d === null && snap.marks.length === 12, `seeds: the ${snap.marks.length} marks equal the native wgpu run's${d ? ": " + d : ""}`);
      const sim = snapshot("seeds.sim-wgpu.json");
      const e = firstDifference(normalize(snap.trace), normalize(sim.trace));
      check(e === null, `seeds: the ${snap.trace.length} allocator events equal the simulator's (wgpu profile)${e ? ": " + e : ""}`);
      check(status.run.device_errors.length === 0, `seeds: no WebGPU errors ${JSON.stringify(status.run.device_errors)}`);
      if (full) {
        // Against PyTorch's seeds.expected.json: `cachalot compare` of the page's run (its
        // downloaded snapshot) names every difference, and shows the same marks and the same
        // reasons as for the native wgpu run. (The page's Compare tab puts two runs side by
        // side but has no reasons panel: that analysis is native-only.)
        const pagePath = `${refs}/seeds.${name}.json`;
        writeFileSync(pagePath, JSON.stringify(snap));
        const page_ = compare(`${refs}/seeds.expected.json`, pagePath);
        const native_ = compare(`${refs}/seeds.expected.json`, `${refs}/seeds.wgpu.json`);
        check(page_.status === 0, `seeds: \`cachalot compare\` with seeds.expected.json names a reason for every difference (exit ${page_.status})`);
        const m = firstDifference(page_.marks, native_.marks);
        check(m === null && page_.marks.length === 12, `seeds: compared with seeds.expected.json, the page's ${page_.marks.length} marks read as the native wgpu run's${m ? ": " + m : ""}`);
        const r = firstDifference(page_.reasons, native_.reasons);
        check(r === null && page_.reasons.length > 0, `seeds: the same ${page_.reasons.length} reasons as for the native wgpu run${r ? ": " + r : ""}`);

        // The page's own Compare tab, given the same expected.json as an upload gives it: the
        // same marks table (equal / different) and the same reasons as `cachalot compare` of
        // the native wgpu run, from the simulator reruns the page ran between its frames.
        const text = readFileSync(`${refs}/seeds.expected.json`, "utf8");
        const runName = status.run.name;
        // Frames drawn while the page compares (each simulator rerun is one frame's work).
        await page.evaluate(() => {
          window.__frames = 0;
          const count = () => {
            window.__frames += 1;
            if (window.__counting) requestAnimationFrame(count);
          };
          window.__counting = true;
          requestAnimationFrame(count);
        });
        await page.waitForFunction(
          ([t, n]) => {
            try {
              window.cachalot.compare_with_expected("seeds.expected.json", t, n);
              return true;
            } catch (e) {
              return false; // the run's tab still takes in its last entries
            }
          },
          [text, runName],
          { timeout: 60000, polling: 200 },
        );
        const comparing = Date.now();
        let framesWhile = 0;
        await page.waitForFunction(
          () => {
            const s = JSON.parse(window.cachalot.compare_status());
            return s && !s.running && s.answer;
          },
          null,
          { timeout: 120000, polling: 50 },
        );
        const drawn = await page.evaluate(() => {
          window.__counting = false;
          return window.__frames;
        });
        framesWhile = await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => done(1))));
        const cmp = JSON.parse(await page.evaluate(() => window.cachalot.compare_status()));
        console.log(`seeds: the page's comparison with seeds.expected.json took ${((Date.now() - comparing) / 1000).toFixed(1)} s, ${drawn} animation frames meanwhile`);
        check(drawn >= 4, `seeds: the page kept drawing while it compared (${drawn} frames: a rerun on the simulator per frame)`);
        check(!cmp.answer.error, `seeds: the page's Compare tab explains the run against seeds.expected.json${cmp.answer.error ? ": " + cmp.answer.error : ""}`);
        // `cachalot compare`'s table rows: "label  A-cell  B-cell", cells `x / y`, `=` or `—`.
        const cell = "(—|=|[\\d,]+ / [\\d,]+\\*?)";
        const row = new RegExp(`^\\s*(\\S+)\\s+${cell}\\s+${cell}\\s*$`);
        const cliRows = native_.marks.map((l) => { const m = l.match(row); return m ? `${m[1]} | ${m[2]} | ${m[3]}` : `unparsed: ${l}`; });
        const pageRows = (cmp.answer.marks || []).map((cells) => cells.join(" | "));
        const pm = firstDifference(pageRows, cliRows);
        check(pm === null && pageRows.length === 12, `seeds: the page's marks side by side (${pageRows.filter((r) => r.endsWith("*")).length} of ${pageRows.length} differ) read as \`cachalot compare\`'s for the native wgpu run${pm ? ": " + pm : ""}`);
        const pageReasons = (cmp.answer.reasons || []).map((l) => l.replaceAll(runName, "B"));
        const cliReasons = native_.reasons.map((l) => l.trim());
        const pr = firstDifference(pageReasons, cliReasons);
        check(pr === null && pageReasons.length > 0, `seeds: the page names the same ${pageReasons.length} reasons as \`cachalot compare\`${pr ? ": " + pr : ""}`);
        check(cmp.answer.verdict_ok === (native_.status === 0), `seeds: the page's verdict (every difference explained: ${cmp.answer.verdict_ok}) is the command line's`);
        check(framesWhile === 1, "seeds: the page draws frames after the comparison");
        // The Compare tab as the page shows it, then back to the segment map for the rest.
        await page.waitForTimeout(500);
        await page.screenshot({ path: shot.replace(/\.png$/, "-compare.png") });
        await page.evaluate(() => window.cachalot.show_view("Segments"));
      }
    }

    // mlp-train, 5 steps
    {
      const { status, snap } = await run({ experiment: "mlp-train", backend: "webgpu", steps: 5, budget_mib: 2048 });
      const result = status.run.result;
      check(result && result.record.error === null, `mlp-train on WebGPU finished (${result && result.record.error})`);
      const native = snapshot("mlp.wgpu.json");
      const d = firstDifference(marksOf(snap), marksOf(native));
      check(d === null && snap.marks.length > 5, `mlp-train: the ${snap.marks.length} marks equal the native wgpu run's${d ? ": " + d : ""}`);
      const sim = snapshot("mlp.sim-wgpu.json");
      const e = firstDifference(normalize(snap.trace), normalize(sim.trace));
      check(e === null, `mlp-train: the ${snap.trace.length} allocator events equal the simulator's (wgpu profile)${e ? ": " + e : ""}`);
      const got = result.record.outcome.losses;
      const want = record(sim).outcome.losses;
      const worst = Math.max(...want.map((w, i) => Math.abs(got[i] - w) / Math.max(Math.abs(w), 1e-30)));
      check(got.length === 5 && want.length === 5 && worst <= 1e-4, `mlp-train: losses ${JSON.stringify(got)} equal the CPU reference's within 1e-4 relative (worst ${worst.toExponential(2)})`);
      check(status.run.device_errors.length === 0, `mlp-train: no WebGPU errors ${JSON.stringify(status.run.device_errors)}`);
      check(snap.segments.length > 0, `mlp-train: the end state holds ${snap.segments.length} segments`);
      // The "Download PyTorch pickle" bytes, read by Python's pickle (no torch needed).
      const bytes = await page.evaluate(() => Array.from(window.cachalot.gpu_pickle()));
      const path = `${refs}/mlp.${name}.pickle`;
      writeFileSync(path, Buffer.from(bytes));
      const read = execFileSync("python3", [
        "-c",
        "import pickle, sys; d = pickle.load(open(sys.argv[1], 'rb')); print(len(d['segments']), len(d['device_traces'][0]))",
        path,
      ]).toString().trim();
      check(read === `${snap.segments.length} ${snap.trace.length}`, `mlp-train: the PyTorch pickle holds the run's segments and trace (${read})`);
    }

    if (full) {
      // The two downloads of the mlp-train run: the snapshot (cachalot's JSON) and the PyTorch
      // pickle, each read back by the command line (`summary` rebuilds the end state and
      // `replay` runs every trace entry through the allocator again).
      const json = await page.evaluate(() => window.cachalot.gpu_snapshot());
      const jsonPath = `${refs}/mlp.${name}.json`;
      writeFileSync(jsonPath, json);
      const picklePath = `${refs}/mlp.${name}.pickle`;
      for (const [what, path] of [["snapshot", jsonPath], ["PyTorch pickle", picklePath]]) {
        const summary = cli(["summary", path]);
        check(summary.ok && summary.out.includes("Allocated memory"), `the downloaded ${what} opens with \`cachalot summary\`${summary.ok ? "" : ": " + summary.err}`);
      }
      const replay = cli(["replay", picklePath]);
      check(replay.ok, `the downloaded PyTorch pickle replays with \`cachalot replay\`${replay.ok ? "" : ": " + replay.err}`);

      // An uploaded op file (the `ops` experiment): the same marks and allocator events as
      // `cachalot run ops --backend wgpu` on the same file.
      {
        const ops = readFileSync(`${refs}/mixed.ops`, "utf8");
        const { status, snap } = await run({ experiment: "ops", backend: "webgpu", ops_name: "mixed.ops", ops, budget_mib: 2048 });
        const result = status.run.result;
        check(result && result.record.error === null, `ops on WebGPU finished (${result && result.record.error})`);
        const native = snapshot("ops.wgpu.json");
        const d = firstDifference(marksOf(snap), marksOf(native));
        check(d === null && snap.marks.length > 0, `ops: the ${snap.marks.length} marks equal the native wgpu run's${d ? ": " + d : ""}`);
        const e = firstDifference(normalize(snap.trace), normalize(native.trace));
        check(e === null && snap.trace.length > 0, `ops: the ${snap.trace.length} allocator events equal the native wgpu run's${e ? ": " + e : ""}`);
      }

      // matmul-sweep on two shapes and three layouts: every product checked, and the marks of
      // the native wgpu run.
      {
        const { status, snap } = await run({ experiment: "matmul-sweep", backend: "webgpu", shapes: "64x64x64,127x33x65", budget_mib: 2048 });
        const result = status.run.result;
        check(result && result.record.error === null, `matmul-sweep on WebGPU finished (${result && result.record.error})`);
        const checks = result.record.outcome.checks;
        check(checks.length > 0 && checks.every((c) => c.passed), `matmul-sweep: its ${checks.length} checks passed${checks.every((c) => c.passed) ? "" : ": " + JSON.stringify(checks.filter((c) => !c.passed))}`);
        const native = snapshot("matmul.wgpu.json");
        const d = firstDifference(marksOf(snap), marksOf(native));
        check(d === null && snap.marks.length > 0, `matmul-sweep: the ${snap.marks.length} marks equal the native wgpu run's${d ? ": " + d : ""}`);
        check(status.run.device_errors.length === 0, `matmul-sweep: no WebGPU errors ${JSON.stringify(status.run.device_errors)}`);
      }
    }

    // Past the budget: the allocator's out-of-memory error, and the page goes on.
    if (full) {
      const oom = (await run({ experiment: "seeds", backend: "webgpu", budget_mib: 16 })).status;
      const error = oom.run.result.record.error || "";
      check(error.includes("out of memory"), `a 16 MiB budget: the allocator's OOM (${error.slice(0, 160)})`);
      // Stop: a long run ends at the next frame, and the page goes on.
      await page.evaluate(() => window.cachalot.run_on_gpu(JSON.stringify({ experiment: "mlp-train", backend: "webgpu", steps: 1000, budget_mib: 2048 })));
      await page.waitForFunction(() => JSON.parse(window.cachalot.gpu_status()).run.marks >= 2, null, { timeout: 120000 });
      await page.evaluate(() => window.cachalot.stop_gpu_run());
      await page.waitForFunction(() => !JSON.parse(window.cachalot.gpu_status()).run.running, null, { timeout: 60000 });
      const stopped = JSON.parse(await page.evaluate(() => window.cachalot.gpu_status())).run;
      check(stopped.stopped && stopped.marks < 1000, `Stop ends a 1,000-step run (after ${stopped.marks} marks)`);
      const { status } = await run({ experiment: "mlp-train", backend: "webgpu", steps: 2, budget_mib: 2048 });
      check(status.run.result.record.error === null, "after the OOM the page runs again");

      await page.waitForTimeout(1500);
      await page.screenshot({ path: shot });
      const map = await page.screenshot({ clip: { x: 420, y: 300, width: 960, height: 520 } });
      check(
        map.length > blank.length * 1.5,
        `the segment map shows segments after the run (picture ${map.length} bytes; before any run ${blank.length})`,
      );
    }
    await checkHealthy(page, errors, check);
    if (full) await gpuFaults(page, check, run, gpu, errors);
  }
  } catch (error) {
    failures.push(`${name}: ${error}`);
    console.log(`FAIL ${name}: ${error}`);
  } finally {
    await browser.close();
  }
};


await session("chromium", await launchChromium(), true);

// No WebGPU (Chromium without the switch, and without a GPU): the page says why, and the same
// experiment runs on the simulator's wgpu profile, with the simulator's marks.
{
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader", "--use-angle=swiftshader"],
  });
  const check = (ok, message) => checkIn(ok, `no WebGPU: ${message}`);
  try {
    const page = await browser.newPage();
    await gotoViewer(page, base);
    const adapter = JSON.parse(await page.evaluate(() => window.cachalot.gpu_status())).adapter;
    check(adapter.state === "missing" && adapter.why.length > 20, `the page says why (${adapter.why})`);
    await page.evaluate(() => window.cachalot.run_on_gpu(JSON.stringify({ experiment: "seeds", backend: "sim" })));
    await page.waitForFunction(() => !JSON.parse(window.cachalot.gpu_status()).run.running, null, { timeout: 300000 });
    const snap = JSON.parse(await page.evaluate(() => window.cachalot.gpu_snapshot()));
    const d = firstDifference(marksOf(snap), marksOf(snapshot("seeds.sim-wgpu.json")));
    check(d === null && snap.marks.length === 12, `seeds on the simulator: the marks equal the native simulator's${d ? ": " + d : ""}`);
  } catch (error) {
    failures.push(`no WebGPU: ${error}`);
    console.log(`FAIL no WebGPU: ${error}`);
  } finally {
    await browser.close();
  }
}
// Firefox where it runs here: a browser that does not start, or has no WebGPU adapter, is
// reported and skipped (never counted as passed); checks of a run that started must pass.
let firefoxBrowser = null;
try {
  firefoxBrowser = await launchFirefox();
} catch (error) {
  console.log(`SKIP firefox: it does not start here (${String(error).split("\n")[0]})`);
}
if (firefoxBrowser) await session("firefox", firefoxBrowser, false);

console.log(`webgpu: ${failures.length === 0 ? "passed" : `${failures.length} failed`}`);
process.exit(failures.length === 0 ? 0 : 1);
