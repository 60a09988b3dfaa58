"""Page frame rate and websocket bytes/s per client, with ~200 requests on the timeline.

    python -m bench.page_fps                    # starts its own server (real model)
    python -m bench.page_fps --url http://127.0.0.1:5050 --seconds 60 --clients 2

Drives the engine at the load slider's maximum with short prompts, waits until the
timeline holds --rows requests, then counts requestAnimationFrame callbacks in each
page (headless Chromium, 1920x1080) and the websocket bytes each page received.
Restores the engine's settings (defaults, load off, reset) at the end.
"""
import argparse
import time

from bench.launch import CHROMIUM, CHROMIUM_ARGS, App



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running First Token (default: start one)")
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window")
    ap.add_argument("--clients", type=int, default=1, help="pages connected at once")
    ap.add_argument("--rows", type=int, default=200, help="timeline rows to reach before measuring")
    ap.add_argument("--chromium", default=CHROMIUM)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    server = None
    if args.url is None:
        server = App()
        args.url = server.url
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            pages = []
            for _ in range(args.clients):
                page = browser.new_page(viewport={"width": 1920, "height": 1080})
                page.goto(args.url + "/")
                page.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=120_000)
                pages.append(page)
            lead = pages[0]
            lead.evaluate("""() => { const lim = firstToken.state.limits;
                firstToken.send({type: 'set', settings: {prompt_tokens: lim.prompt_tokens.min, max_new_tokens: 16,
                                                        rate: lim.rate.max, load: true}}); }""")
            lead.wait_for_function(f"() => firstToken.state.order.length >= {args.rows}",
                                   timeout=180_000, polling=500)
            read = "[firstToken.perf.frames, firstToken.state.bytes, performance.now()]"
            start = [pg.evaluate(read) for pg in pages]
            time.sleep(args.seconds)
            end = [pg.evaluate(read) for pg in pages]
            for i, (pg, a, b) in enumerate(zip(pages, start, end)):
                dt = (b[2] - a[2]) / 1000
                rows, draw_ms = pg.evaluate("[firstToken.ui.layouts.timeline.lanes.length, firstToken.perf.drawMs]")
                print(f"client {i}: {(b[0] - a[0]) / dt:.1f} fps, {draw_ms:.1f} ms script per frame, "
                      f"{(b[1] - a[1]) / dt / 1000:.1f} kB/s websocket, {rows} timeline rows, over {dt:.0f} s")
            lead.evaluate("""() => { const lim = firstToken.state.limits, d = {};
                for (const n in lim) d[n] = lim[n].default;
                firstToken.send({type: 'set', settings: d}); firstToken.send({type: 'reset'}); }""")
            lead.wait_for_timeout(500)
            browser.close()
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
