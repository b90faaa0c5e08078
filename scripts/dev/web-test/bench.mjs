// The web page's side of BENCHMARKS.md's web section (scripts/dev/bench-web.sh runs it beside
// the native references): seconds to open each file given (fetch + parse + rebuild, from
// `open_url` to the end of the frame that drew the tab's timeline; median of RUNS page loads), and the `ops` experiment
// on the page's WebGPU with an op file (the runtime's own "ns per op" line). Prints JSON lines.
//
//   [RUNS=3] [SETTLE=2000] [VERBOSE=1] node bench.mjs BASE_URL OPS_FILE FILE_URL...
import { readFileSync } from "node:fs";
import { gotoViewer, launchChromium } from "./chromium.mjs";

const [base, opsPath, ...files] = process.argv.slice(2);
if (!base || !opsPath) {
  console.error("usage: node bench.mjs BASE_URL OPS_FILE FILE_URL...");
  process.exit(2);
}
const runs = Number(process.env.RUNS || 3);
const settle = Number(process.env.SETTLE ?? 2000);

const browser = await launchChromium();

const ready = (page) => gotoViewer(page, base);

try {
  for (const file of files) {
    const seconds = [];
    const loads = [];
    const marks = [];
    const warmed = [];
    let entries = 0;
    for (let i = 0; i < runs; i++) {
      const page = await browser.newPage({ viewport: { width: 1400, height: 860 } });
      await ready(page);
      // The page as a visitor's click finds it: its start (wasm compiled, first frames) over.
      // Timed right after the start instead (SETTLE=0), the open waits up to a second more for
      // an animation frame: Chromium throttles the frames of a page whose main thread was busy.
      await page.waitForTimeout(settle);
      // Timed inside the page, polling every 5 ms for a drawn timeline: from the call to the
      // page's mark at the end of the frame that drew it. The page's own performance marks
      // (fetch, fetched, load, loaded, tab added, timeline drawn, timeline painted) and the
      // animation frames on the way say where the time went.
      const result = await page.evaluate(
        (url) =>
          new Promise((done, fail) => {
            // Whether the page had warmed its code (viewer/src/web/warm.rs) in the wait before this open.
            const warmed = performance.getEntriesByName("cachalot warmed up").length > 0;
            performance.clearMarks();
            const frames = [];
            let recording = true;
            const frame = (t) => {
              frames.push(performance.now());
              if (recording) requestAnimationFrame(frame);
            };
            requestAnimationFrame(frame);
            const started = performance.now();
            window.cachalot.open_url(url);
            const poll = () => {
              const s = JSON.parse(window.cachalot.status());
              if (s.notices.some((n) => n.includes("error") || n.includes("failed"))) return fail(JSON.stringify(s.notices));
              if (s.tabs.length > 0 && s.loading === 0 && s.tabs.every((t) => t.timeline_drawn)) {
                recording = false;
                const ms = (t) => Math.round((t - started) * 10) / 10;
                const marks = Object.fromEntries(
                  performance
                    .getEntriesByType("mark")
                    .filter((m) => m.name.startsWith("cachalot "))
                    .map((m) => {
                      const words = m.name.split(" ").slice(1);
                      return [words[0].startsWith("load") || words[0].startsWith("fetch") ? words[0] : words.join(" "), ms(m.startTime)];
                    }),
                );
                // The end: the frame that drew the timeline handed to the GPU (the page marks it
                // when that frame's callback is over). The poll's own time comes up to a
                // timer tick, and sometimes a whole later frame, after it.
                const painted = performance.getEntriesByName("cachalot timeline painted")[0];
                if (!painted) return fail("the page left no 'cachalot timeline painted' mark");
                return done({ seconds: (painted.startTime - started) / 1000, polled: ms(performance.now()), entries: s.tabs[0].entries, warmed, marks, frames: frames.map(ms) });
              }
              setTimeout(poll, 5);
            };
            poll();
          }),
        file,
      );
      if (process.env.VERBOSE) console.error(JSON.stringify({ file, ...result }));
      seconds.push(result.seconds);
      loads.push((result.marks.loaded - result.marks.load) / 1000);
      marks.push(result.marks);
      warmed.push(result.warmed);
      entries = result.entries;
      await page.close();
    }
    // The median run's marks; the parse + rebuild time is the median of its own.
    const order = seconds.map((s, i) => i).sort((a, b) => seconds[a] - seconds[b]);
    const middle = order[Math.floor(order.length / 2)];
    loads.sort((a, b) => a - b);
    console.log(
      JSON.stringify({
        file: file.split("/").pop(),
        entries,
        seconds: seconds[middle],
        load_seconds: loads[Math.floor(loads.length / 2)],
        // In how many of the runs the page had warmed its code before the open.
        warmed: warmed.filter(Boolean).length,
        marks: marks[middle],
      }),
    );
  }

  const page = await browser.newPage();
  await ready(page);
  const ops = readFileSync(opsPath, "utf8");
  const name = opsPath.split("/").pop();
  const lines = [];
  for (let i = 0; i < runs; i++) {
    await page.evaluate(
      ([name, ops]) => window.cachalot.run_on_gpu(JSON.stringify({ experiment: "ops", backend: "webgpu", ops_name: name, ops, budget_mib: 4096 })),
      [name, ops],
    );
    await page.waitForFunction(() => !JSON.parse(window.cachalot.gpu_status()).run.running, null, { timeout: 600000, polling: 200 });
    const s = JSON.parse(await page.evaluate(() => window.cachalot.gpu_status()));
    if (s.run.result.record.error) throw new Error(s.run.result.record.error);
    lines.push(s.run.result.record.outcome.lines[0]);
  }
  const ns = lines.map((l) => Number(/\(([0-9.]+) ns per op/.exec(l)[1])).sort((a, b) => a - b);
  console.log(JSON.stringify({ ops: name, webgpu_ns_per_op: ns[Math.floor(ns.length / 2)], lines }));
} finally {
  await browser.close();
}
