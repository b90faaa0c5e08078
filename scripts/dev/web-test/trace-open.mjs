// Where one open of a file in the page spends its time, from Chromium's own trace: the page's
// main-thread tasks from `open_url` to the page's first task after the frame that drew the
// timeline (bench.mjs's end point), the fetch's response and body, the idle wait for the frame,
// the page's performance marks, and the CPU profile's samples by function after the timeline
// was laid out. Tracing slows the page down (an open takes about 1.3x bench.mjs's time):
// read it for the shares, not the totals. Prints a table; `TRACE=out.json` keeps the trace
// for chrome://tracing or Perfetto.
//
//   [SETTLE=2500] [TRACE=out.json] node trace-open.mjs BASE_URL FILE_URL
import { writeFileSync } from "node:fs";
import { launchChromium } from "./chromium.mjs";

const [base, file] = process.argv.slice(2);
if (!base || !file) {
  console.error("usage: node trace-open.mjs BASE_URL FILE_URL");
  process.exit(2);
}
const browser = await launchChromium();
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 860 } });
  await page.goto(base);
  await page.waitForFunction(
    () => window.cachalot && JSON.parse(window.cachalot.gpu_status()).adapter.state !== "pending",
    null,
    { timeout: 120000 },
  );
  // As bench.mjs: the page's start (and its warm-up) over before the open.
  await page.waitForTimeout(Number(process.env.SETTLE ?? 2500));
  await browser.startTracing(page, {
    categories: ["devtools.timeline", "disabled-by-default-devtools.timeline", "blink.user_timing", "toplevel", "disabled-by-default-v8.cpu_profiler"],
  });
  await page.evaluate(
    (url) =>
      new Promise((done) => {
        performance.clearMarks();
        performance.mark("bench start");
        window.cachalot.open_url(url);
        const poll = () => {
          const s = JSON.parse(window.cachalot.status());
          if (s.tabs.length > 0 && s.loading === 0 && s.tabs.every((t) => t.timeline_drawn)) {
            performance.mark("bench end");
            return done();
          }
          setTimeout(poll, 5);
        };
        poll();
      }),
    file,
  );
  const trace = await browser.stopTracing();
  if (process.env.TRACE) writeFileSync(process.env.TRACE, trace);
  report(JSON.parse(trace.toString()).traceEvents);
} finally {
  await browser.close();
}

function report(events) {
  const mark = (name) => events.find((e) => e.name === name);
  const start = mark("bench start");
  const end = mark("bench end");
  const ms = (ts) => ((ts - start.ts) / 1000).toFixed(1);
  const main = (e) => e.pid === start.pid && e.tid === start.tid && e.ts >= start.ts && e.ts <= end.ts;
  console.log(`open of ${file}: ${ms(end.ts)} ms under tracing`);
  console.log("\nmarks and the fetch (ms from open_url):");
  const points = events
    .filter((e) => main(e) && (e.name.startsWith("cachalot ") || /^Resource(ReceiveResponse|Finish)$/.test(e.name)))
    .sort((a, b) => a.ts - b.ts);
  for (const e of points) console.log(`  ${ms(e.ts).padStart(7)}  ${e.name}`);
  console.log("\nmain-thread tasks of 1 ms or more (start, ms):");
  let busy = 0;
  for (const e of events.filter((e) => main(e) && e.name === "RunTask" && e.ph === "X").sort((a, b) => a.ts - b.ts)) {
    busy += e.dur / 1000;
    if (e.dur < 1000) continue;
    const inner = events.find(
      (i) => main(i) && i.ts >= e.ts && i.ts < e.ts + e.dur && /FireAnimationFrame|TimerFire|SimpleWatcher|RunMicrotasks/.test(i.name),
    );
    console.log(`  ${ms(e.ts).padStart(7)} ${(e.dur / 1000).toFixed(1).padStart(6)}  ${inner ? inner.name : "task"}`);
  }
  console.log(`  main thread busy ${busy.toFixed(1)} of ${ms(end.ts)} ms`);

  // The CPU profile's samples after the timeline was laid out, by the innermost function of
  // cachalot, egui, eframe or wgpu on their stack.
  const drawn = mark("cachalot timeline drawn");
  const nodes = new Map();
  let t = 0;
  const samples = [];
  for (const e of events.filter((e) => e.name === "Profile" || e.name === "ProfileChunk")) {
    const data = e.args.data;
    if (e.name === "Profile") {
      t = data.startTime;
      continue;
    }
    for (const n of data.cpuProfile?.nodes ?? []) nodes.set(n.id, n);
    (data.cpuProfile?.samples ?? []).forEach((id, i) => {
      t += data.timeDeltas[i];
      samples.push([t, id]);
    });
  }
  if (!drawn || samples.length === 0) return;
  const owner = (id) => {
    for (let n = nodes.get(id); n; n = nodes.get(n.parent)) {
      const name = n.callFrame.functionName;
      const crate = /^<?(cachalot_\w+|egui\w*|epaint|eframe|wgpu\w*)::/.exec(name);
      if (crate) return crate[1];
    }
    return nodes.get(id)?.callFrame.functionName || "(browser)";
  };
  const counts = new Map();
  const after = samples.filter(([ts]) => ts >= drawn.ts && ts <= end.ts);
  for (const [, id] of after) counts.set(owner(id), (counts.get(owner(id)) ?? 0) + 1);
  console.log(`\nafter the timeline was laid out (${ms(drawn.ts)} to ${ms(end.ts)} ms), CPU samples by crate:`);
  for (const [name, n] of [...counts].sort((a, b) => b[1] - a[1]).slice(0, 12)) console.log(`  ${String(n).padStart(4)}  ${name}`);
}
