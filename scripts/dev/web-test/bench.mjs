// The web page's side of BENCHMARKS.md's web section (scripts/dev/bench-web.sh runs it beside
// the native references): seconds to open each file given (fetch + parse + rebuild, from
// `open_url` to the tab's timeline drawn; median of RUNS page loads), and the `ops` experiment
// on the page's WebGPU with an op file (the runtime's own "ns per op" line). Prints JSON lines.
//
//   node bench.mjs BASE_URL OPS_FILE FILE_URL...
import { readFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [base, opsPath, ...files] = process.argv.slice(2);
if (!base || !opsPath) {
  console.error("usage: node bench.mjs BASE_URL OPS_FILE FILE_URL...");
  process.exit(2);
}
const runs = Number(process.env.RUNS || 3);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run", "--disable-background-networking"],
});

const ready = async (page) => {
  await page.goto(base);
  await page.waitForFunction(
    () => {
      const s = window.cachalot ? JSON.parse(window.cachalot.gpu_status()) : null;
      return s && s.adapter.state !== "pending";
    },
    null,
    { timeout: 120000 },
  );
};

try {
  for (const file of files) {
    const seconds = [];
    let entries = 0;
    for (let i = 0; i < runs; i++) {
      const page = await browser.newPage({ viewport: { width: 1400, height: 860 } });
      await ready(page);
      // Timed inside the page, polling every 5 ms: from the call to a drawn timeline.
      const result = await page.evaluate(
        (url) =>
          new Promise((done, fail) => {
            const started = performance.now();
            window.cachalot.open_url(url);
            const poll = () => {
              const s = JSON.parse(window.cachalot.status());
              if (s.notices.some((n) => n.includes("error") || n.includes("failed"))) return fail(JSON.stringify(s.notices));
              if (s.tabs.length > 0 && s.loading === 0 && s.tabs.every((t) => t.timeline_drawn)) {
                return done({ seconds: (performance.now() - started) / 1000, entries: s.tabs[0].entries });
              }
              setTimeout(poll, 5);
            };
            poll();
          }),
        file,
      );
      seconds.push(result.seconds);
      entries = result.entries;
      await page.close();
    }
    seconds.sort((a, b) => a - b);
    console.log(JSON.stringify({ file: file.split("/").pop(), entries, seconds: seconds[Math.floor(seconds.length / 2)] }));
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
