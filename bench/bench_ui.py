"""UI benchmark: how fast the pages of a very long session load.

    .venv/bin/python bench/bench_ui.py                 # ~1 min on 2 cores
    .venv/bin/python bench/bench_ui.py --messages 20000 --checkpoints 10   # quicker

A throwaway embedded stack (PostgreSQL, Temporal dev server); one session's record of
100,000 messages (user / assistant with a tool call / tool result / harness, ~60 words
each) and 50 checkpoints (a mind near its section limits, 20 memo entries, a now) inserted
directly into the tables, then the UI served by `keel.ui.server.ui_server` and each page
fetched over HTTP, median and p90 over the runs. With /usr/bin/chromium present, the same
session page is also loaded in headless Chromium (navigation start to the load event).
Figures go to stdout and bench/results/ui.json (ui-custom.json for other sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import cancel_on_sigterm, percentile, table  # noqa: E402
from bench.stack import bench_stack, machine, say, write_json  # noqa: E402
from keel.client import KeelClient  # noqa: E402
from keel.ui.server import ui_server  # noqa: E402
from schemas.checkpoint.mind import MindDocument  # noqa: E402
from schemas.config import ModelSettings  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WORDS = ("review the pull request in the queue oldest first and write the verdict to the "
         "reviews folder with the reasons and the files it touches").split()


def _sentence(n: int, words: int = 60) -> str:
    return " ".join(WORDS[(n + i) % len(WORDS)] for i in range(words))


def _mind(k: int) -> str:
    lines = MindDocument.template().text.splitlines()
    out: list[str] = []
    for line in lines:
        out.append(line)
        if line.startswith("### Mission"):
            out += [f"- [{'done' if i < k // 10 else 'active'}] mission entry {i}: "
                    + _sentence(i, 12) for i in range(6)]
        elif line.startswith("### Workstreams"):
            out += [f"- workstream {i}: reviewed through PR #{100 + k * 2 + i}" for i in range(8)]
        elif line.startswith("## Key decisions"):
            out += [f"- decision {i}: " + _sentence(i + k, 20) for i in range(min(k, 25))]
        elif line.startswith("## Lessons"):
            out += [f"- lesson {i}: " + _sentence(i * 3, 18) for i in range(12)]
    return "\n".join(out)


def seed(database_url: str, session_id: str, messages: int, checkpoints: int) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id) VALUES (%s)", (session_id,))
        # Four kinds of rows in turn: user, assistant with a tool call, its result, harness.
        conn.execute(
            "INSERT INTO messages (session_id, seq, input_id, type, source_line, content_text,"
            " content, token_count, turn)"
            " SELECT %(s)s, g, 'in-' || g,"
            "  (ARRAY['user','assistant','tool_result','harness'])[g %% 4 + 1],"
            "  CASE WHEN g %% 4 = 3 THEN '[Harness: Watch ci \"CI status\"]' END,"
            "  'message ' || g || ': ' || %(text)s,"
            "  CASE g %% 4 WHEN 1 THEN jsonb_build_array(jsonb_build_object('type','text','text',"
            "   'x'), jsonb_build_object('type','tool_use','id','tu-' || g,'name','read_file',"
            "   'input', jsonb_build_object('path','prs/' || g || '.md')))"
            "   WHEN 2 THEN jsonb_build_object('tool_use_id','tu-' || (g - 1),'is_error',false)"
            "  END, 80, g / 8"
            " FROM generate_series(1, %(n)s) g",
            {"s": session_id, "n": messages, "text": _sentence(0)})
        step = max(1, messages // (checkpoints + 1))
        for k in range(1, checkpoints + 1):
            cut = k * step
            memo = [{"seq": s, "text": f"message {s}: " + _sentence(s, 30), "cut": False}
                    for s in range(max(4, cut - 80), cut, 4)][:20]
            conn.execute(
                "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq,"
                " upto_seq, mind_text, mind_context_text, memo, now_text, rendered,"
                " rendered_tokens, tokens_moved_out, window_tokens_before, window_tokens_after,"
                " created_at)"
                " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,'',0,%s,%s,%s,"
                " now() - make_interval(mins => %s))",
                (f"ckpt:{session_id}:{k}", session_id, "model" if k % 7 else "move_half",
                 cut, cut, cut, _mind(k), _mind(k), json.dumps(memo),
                 f"Current step: PR #{100 + k}\nProgress: reviewed through PR #{99 + k}",
                 150_000, 182_000, 32_000, checkpoints - k))
        conn.execute("ANALYZE messages")
        conn.execute("ANALYZE checkpoints")


def fetch(url: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
        status = response.status
    return time.perf_counter() - t0, status, len(body)


async def time_page(url: str, runs: int) -> dict[str, Any]:
    await asyncio.to_thread(fetch, url)  # warm-up
    times, size = [], 0
    for _ in range(runs):
        seconds, status, size = await asyncio.to_thread(fetch, url)
        if status != 200:
            raise RuntimeError(f"{url}: HTTP {status}")
        times.append(seconds)
    return {"median_ms": round(percentile(times, 50) * 1000, 1),
            "p90_ms": round(percentile(times, 90) * 1000, 1), "bytes": size, "runs": runs}


async def browser_load(url: str, runs: int) -> dict[str, Any] | None:
    if not CHROMIUM.exists():
        return None
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = await browser.new_page()
        times = []
        for _ in range(runs + 1):
            await page.goto(url, wait_until="load")
            times.append(await page.evaluate(
                "(() => { const n = performance.getEntriesByType('navigation')[0];"
                " return n.loadEventEnd - n.startTime; })()"))
        await browser.close()
    times = times[1:]
    return {"median_ms": round(percentile(times, 50), 1),
            "p90_ms": round(percentile(times, 90), 1), "runs": runs}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    out: dict[str, Any] = {"benchmark": "ui", "machine": machine(),
                           "messages": args.messages, "checkpoints": args.checkpoints}
    session_id = f"bench-ui-{uuid.uuid4().hex[:6]}"
    async with bench_stack(ModelSettings()) as (client, settings):
        t0 = time.perf_counter()
        seed(settings.database_url or "", session_id, args.messages, args.checkpoints)
        out["seed_seconds"] = round(time.perf_counter() - t0, 1)
        say(f"seeded {args.messages:,} messages and {args.checkpoints} checkpoints in "
            f"{out['seed_seconds']} s")
        keel = KeelClient(client, settings.task_queue, settings)
        async with ui_server(keel, settings, settings.database_url or "", port=0) as url:
            base = url.removesuffix("/sessions")
            s = f"{base}/sessions/{session_id}"
            pages = {
                "sessions list": f"{base}/sessions",
                "session, latest page (200 messages)": s,
                "session, first page": f"{s}?from=1",
                "session, a middle page": f"{s}?from={args.messages // 2}",
                "session, the user's words only": f"{s}?user=1&from={args.messages // 2}",
                "checkpoints timeline": f"{s}/checkpoints",
                f"checkpoint {args.checkpoints} (mind diff, memo)":
                    f"{s}/checkpoints/{args.checkpoints}",
            }
            out["http"] = {}
            for name, page_url in pages.items():
                out["http"][name] = await time_page(page_url, args.runs)
                say(f"  {name}: {out['http'][name]['median_ms']} ms")
            out["browser_session_page"] = await browser_load(s, max(3, args.runs // 2))
    return out


def report(out: dict[str, Any]) -> None:
    rows = [[name, r["median_ms"], r["p90_ms"], f"{r['bytes']:,}"]
            for name, r in out["http"].items()]
    say("")
    runs = next(iter(out["http"].values()))["runs"]
    say(table(f"UI pages over HTTP, a session of {out['messages']:,} messages and "
              f"{out['checkpoints']} checkpoints ({runs} runs each)",
              ["page", "median ms", "p90 ms", "bytes"], rows))
    b = out.get("browser_session_page")
    if b:
        say(f"\nsession page in headless Chromium, navigation to load event: median "
            f"{b['median_ms']} ms, p90 {b['p90_ms']} ms ({b['runs']} loads)")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=50)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    out = asyncio.run(main(args))
    report(out)
    name = "ui" if (args.messages, args.checkpoints) == (100_000, 50) else "ui-custom"
    say(f"\nwritten to {write_json(name, out)}")


if __name__ == "__main__":
    cli()
