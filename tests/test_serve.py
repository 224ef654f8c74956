"""`stepcast serve`: the JSON API answers what the commands print with `--format json` (same functions, same
numbers), refuses bad, oversized and out-of-bounds requests with the CLI's messages, serves no file but the page and
the Vega bundle, and the page draws its charts in headless Chromium from this server alone.

The server runs on a free loopback port in a thread (uvicorn), on the session's built store. Browser checks skip
when /usr/bin/chromium is absent, except under CI=true where they fail instead (tests/test_reports.py)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from typer.testing import CliRunner

from tests.test_reports import browser  # noqa: F401 - the headless Chromium fixture of the report tests

GPT3 = {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "gpus": "1024", "global_batch": "1536", "seq_len": "2048",
        "tp": "8", "pp": "8"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(built_store):
    """(base URL, Explorer state) of a server on the built store, for the whole module."""
    import uvicorn

    from pipeline.serve import create_app
    from pipeline.settings import Settings

    app = create_app(Settings.load(store=built_store))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}", app.app.state.explorer
    srv.should_exit = True
    thread.join(timeout=10)


def get(base: str, path: str, params: dict | None = None) -> tuple[int, object]:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def raw(base: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """A request sent as written (no client-side normalisation of '..'): (status, body bytes)."""
    host, port = base.removeprefix("http://").split(":")
    con = http.client.HTTPConnection(host, int(port), timeout=30)
    con.putrequest(method, path, skip_accept_encoding=True,
                   skip_host=any(k.lower() == "host" for k in (headers or {})))
    for k, v in (headers or {}).items():
        con.putheader(k, v)
    if body is not None:
        con.putheader("Content-Length", str(len(body)))
    con.endheaders(body)
    r = con.getresponse()
    out = r.status, r.read()
    con.close()
    return out


def cli(store, *args) -> tuple[int, str, str]:
    from pipeline.cli import app

    r = CliRunner().invoke(app, ["--store", str(store), *args])
    return r.exit_code, r.stdout, r.stderr


def flags(params: dict) -> list[str]:
    out = []
    for k, v in params.items():
        out += [f"--{k.replace('_', '-')}"] if v is True else [f"--{k.replace('_', '-')}", str(v)]
    return out


def api_equals_cli(base: str, store, endpoint: str, q: dict, *extra: str):
    """GET /api/<endpoint> with `q` and run `stepcast <endpoint>` with the same flags (+ `extra`): both succeed and
    answer the same JSON, which is returned."""
    status, doc = get(base, f"/api/{endpoint}", {k: "true" if v is True else v for k, v in q.items()})
    assert status == 200, doc
    code, out, err = cli(store, endpoint, *flags(q), *extra, "--format", "json")
    assert code == 0, err
    assert doc == json.loads(out)
    return doc


# ------------------------------------------------------------------ the API answers what the CLI prints

def test_predict_equals_the_cli(server, built_store):
    base, _ = server
    doc = api_equals_cli(base, built_store, "predict", GPT3)
    row = doc[0]
    assert row["feasible"] and row["fit_version"] and row["step_time_lo_s"] < row["step_time_s"] < row["step_time_hi_s"]
    status, ideal = get(base, "/api/predict", {**GPT3, "assumptions": "ideal"})
    assert status == 200 and ideal[0]["assumptions"].startswith("ideal") and ideal[0]["mfu"] > row["mfu"]


def test_search_equals_the_cli_with_network_overrides(server, built_store):
    base, _ = server
    q = {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": "64", "global_batch": "256", "seq_len": "8192",
         "top": "5", "scaleout_gbps": "12.5"}
    doc = api_equals_cli(base, built_store, "search", q)
    assert [r["rank"] for r in doc] == [1, 2, 3, 4, 5]
    _, wide = get(base, "/api/search", {**q, "scaleout_gbps": "400"})
    assert wide[0]["tokens_per_s_per_gpu"] >= doc[0]["tokens_per_s_per_gpu"]  # a faster network never slows the best


def test_network_tiers_equal_the_cli(server, built_store):
    """`oversubscription` and `pod_size` are the CLI's flags: same JSON, and a slower step than without them."""
    base, _ = server
    q = {"model": "llama3-70b", "gpu": "h100-sxm5-80gb", "gpus": "512", "global_batch": "1024", "seq_len": "8192",
         "tp": "8", "pp": "4", "oversubscription": "3", "pod_size": "256"}
    doc = api_equals_cli(base, built_store, "predict", q)
    _, plain = get(base, "/api/predict", {k: v for k, v in q.items() if k not in ("oversubscription", "pod_size")})
    assert doc[0]["step_time_s"] > plain[0]["step_time_s"] and "3:1 oversubscribed" in doc[0]["assumptions"]
    s = {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": "64", "global_batch": "256", "seq_len": "8192",
         "top": "3", "oversubscription": "4"}
    api_equals_cli(base, built_store, "search", s)


def test_hybrid_models_are_offered_and_answered_as_the_cli_does(server, built_store):
    """Hybrids (Mamba-2: Nemotron-H, Nemotron 3; Mamba-1: Jamba) are in the page's model list and the API answers
    for them as the CLI does."""
    base, _ = server
    page = urllib.request.urlopen(base + "/", timeout=30).read().decode()
    assert '"nemotron-h-56b"' in page and '"nemotron-3-nano"' in page and '"jamba-v0.1"' in page
    q = {"model": "nemotron-h-8b", "gpu": "h100-sxm5-80gb", "gpus": "64", "global_batch": "256", "seq_len": "8192",
         "sharding": "zero3", "recompute": "none"}  # the layout `search` ranks first
    doc = api_equals_cli(base, built_store, "predict", q)
    assert doc[0]["step_time_s"] > 0, doc[0]
    assert doc[0]["feasible"], doc[0]["error"]


def test_the_page_has_the_oversubscription_control(server):
    base, _ = server
    page = urllib.request.urlopen(base + "/", timeout=30).read().decode()
    assert 'id="oversubscription"' in page and 'id="pod_size"' in page
    assert '"oversubscription", "pod_size"]' in page  # kept in the URL state (FIELDS) like the other overrides


def test_curve_equals_the_cli(server, built_store):
    base, _ = server
    q = {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "tokens": "3e11", "global_batch": "1536", "max_gpus": "4096",
         "scaleup_size": "16"}
    doc = api_equals_cli(base, built_store, "curve", q)
    assert doc["points"][-1]["n_gpus"] == 4096 and "inflection_n" in doc["inflection"]


def test_frontier_equals_the_cli_with_every_level(server, built_store):
    base, _ = server
    q = {"gpu": "gtx-580-3gb", "assumptions": "ideal", "months": "3"}
    doc = api_equals_cli(base, built_store, "frontier", {**q, "table": True})
    assert len(doc["levels"]) == 65 and doc["latency_wall_days"] > 0
    _, short = get(base, "/api/frontier", q)
    assert "levels" not in short and short["max_training_flop"] == doc["max_training_flop"]


def test_pasted_config_json_is_the_arch_file(server, built_store, tmp_path):
    """A Hugging Face config.json pasted into the page (arch_json) answers as `--arch-file` with that file."""
    base, _ = server
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    q = {"gpu": "h100-sxm5-80gb", "gpus": "8", "global_batch": "64", "seq_len": "8192"}
    status, doc = get(base, "/api/predict", {**q, "arch_json": json.dumps(config)})
    assert status == 200, doc
    code, out, err = cli(built_store, "predict", "--arch-file", str(path), *flags(q), "--format", "json")
    assert code == 0, err
    cli_doc = json.loads(out)
    assert doc[0]["step_time_s"] == cli_doc[0]["step_time_s"] and doc[0]["memory_gb_per_gpu"] == cli_doc[0]["memory_gb_per_gpu"]
    status, bad = get(base, "/api/curve", {"gpu": "h100-sxm5-80gb", "arch_json": '{"model_type": "llama"'})
    assert status == 400 and bad["error"].startswith("arch_json: not valid JSON")


# ------------------------------------------------------------------ bad input: 400 with the CLI's message

@pytest.mark.parametrize("command, params", [
    ("predict", {**GPT3, "gpus": "1000"}),
    ("predict", {**GPT3, "model": "gpt-9"}),
    ("predict", {**GPT3, "sharding": "zero9"}),
    ("search", {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "gpus": "64", "global_batch": "64", "seq_len": "2048",
                "rank_by": "speed"}),
    ("curve", {"model": "llama3-8b", "gpu": "a100-sxm4-80gb", "policy": "linear"}),
    ("curve", {"model": "llama3-8b", "gpu": "a100-sxm4-80gb", "scaleup_gbps": "-5"}),
    ("frontier", {"gpu": "h100-sxm5-80gb", "min_utilization": "80"}),
    ("frontier", {"gpu": "h900"}),
    ("predict", {**GPT3, "oversubscription": "0.5"}),
    ("search", {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": "64", "global_batch": "256",
                "seq_len": "8192", "pod_size": "4"}),
    ("curve", {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "oversubscription": "inf"}),
    ("frontier", {"gpu": "h100-sxm5-80gb", "oversubscription": "0"}),
])
def test_bad_input_is_400_with_the_cli_message(server, built_store, command, params):
    base, _ = server
    status, doc = get(base, f"/api/{command}", params)
    assert status == 400, doc
    code, _, err = cli(built_store, command, *flags(params), "--format", "json")
    assert code == 2
    assert f"error: {doc['error']}" in err


def test_unknown_parameters_and_types_are_400(server):
    base, _ = server
    status, doc = get(base, "/api/predict", {**GPT3, "gpus": "many"})
    assert status == 400 and doc["error"] == "Invalid value for '--gpus': 'many' is not a valid integer."
    status, doc = get(base, "/api/curve", {"model": "llama3-8b", "gpu": "h100", "arch_file": "/etc/passwd"})
    assert status == 400 and doc["error"].startswith("unknown parameter 'arch_file' for /api/curve")
    status, doc = get(base, "/api/predict", {"model": "gpt3-175b"})
    assert status == 400 and doc["error"].startswith("missing --gpu, --gpus, --global-batch, --seq-len")


def test_no_feasible_layout_is_422_with_the_cli_message(server, built_store):
    base, _ = server
    q = {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "gpus": "8", "global_batch": "8", "seq_len": "2048"}
    status, doc = get(base, "/api/search", q)
    assert status == 422 and doc["error"].startswith("no feasible layout among")
    code, _, err = cli(built_store, "search", *flags(q))
    assert code == 1 and doc["error"] in err


# ------------------------------------------------------------------ bounds: size, work, time; nothing else served

def test_oversized_and_out_of_bounds_requests_are_refused(server):
    base, _ = server
    status, doc = get(base, "/api/search", {"model": "gpt3-175b", "gpu": "a100", "gpus": str(10**7),
                                            "global_batch": "1536", "seq_len": "2048"})
    assert status == 400 and "is not in the range 1<=x<=131072" in doc["error"]
    status, doc = get(base, "/api/curve", {"model": "gpt3-175b", "gpu": "a100", "max_gpus": str(10**9)})
    assert status == 400 and "--max-gpus" in doc["error"]
    status, doc = get(base, "/api/search", {"model": "gpt3-175b", "gpu": "a100", "gpus": "8", "global_batch": "8",
                                            "seq_len": "2048", "top": "100000"})
    assert status == 400 and "--top" in doc["error"]
    status, body = raw(base, "GET", "/api/curve?model=" + "x" * 20_000)
    assert status == 414 and b"query string over" in body
    status, body = raw(base, "POST", "/api/predict", body=b"{}")
    assert status == 405
    status, body = raw(base, "GET", "/api/predict", body=b"x" * 10)
    assert status == 413


def test_a_request_that_takes_too_long_is_504_and_a_full_server_503(server):
    base, ex = server
    saved = ex.timeout_s
    ex.timeout_s = 0.01
    try:
        status, doc = get(base, "/api/frontier", {"gpu": "v100-sxm2-32gb", "months": "2.5"})
    finally:
        ex.timeout_s = saved
    assert status == 504 and "no answer within 0.01 s" in doc["error"]
    from pipeline.serve import MAX_IN_FLIGHT

    with ex.lock:
        ex.in_flight += MAX_IN_FLIGHT
    try:
        status, doc = get(base, "/api/curve", {"model": "llama3-8b", "gpu": "h100"})
    finally:
        with ex.lock:
            ex.in_flight -= MAX_IN_FLIGHT
    assert status == 503 and doc["error"].startswith("busy")


def test_a_foreign_host_header_is_refused(server):
    """DNS rebinding: a page under another name (evil.example resolving to 127.0.0.1) reaches the server with its own
    name in the Host header; only this server's names, at its port, are answered."""
    base, _ = server
    port = base.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1:1", f"localhost.evil.example:{port}"):
        status, body = raw(base, "GET", "/api/curve?model=llama3-8b&gpu=h100&max_gpus=8", headers={"Host": host})
        assert status == 403, (host, status)
        doc = json.loads(body)
        assert list(doc) == ["error"] and "\n" not in doc["error"] and f"Host '{host}' is not this server" in doc["error"]
    status, body = raw(base, "GET", "/", headers={"Host": "evil.example"})
    assert status == 403 and b"<html" not in body.lower()
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        status, _ = raw(base, "GET", "/api/frontier?gpu=h100&months=1", headers={"Host": host})
        assert status == 200, host


def test_nan_infinity_and_huge_numbers_are_400_never_500(server, built_store):
    """Numbers no field can hold, in a pasted config.json or a query parameter, are refused naming them; the CLI
    refuses the same query with the same message."""
    base, _ = server
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    text = json.dumps(config)
    q = {"gpu": "h100-sxm5-80gb", "gpus": "8", "global_batch": "64", "seq_len": "8192"}
    for bad, needle in ((text.replace("4096", "NaN"), "'hidden_size' = NaN"),
                        (text.replace("4096", "Infinity"), "'hidden_size' = Infinity"),
                        (text.replace("4096", "9" * 4000), "'hidden_size' = a 4000-digit integer"),
                        (text.replace("4096", "1e400"), "'hidden_size' = Infinity"),
                        (text.replace("4096", "99999999"), "'d_model' = 99999999 is above the largest 16777216")):
        status, doc = get(base, "/api/predict", {**q, "arch_json": bad})
        assert status == 400 and doc["error"].startswith("arch_json: ") and needle in doc["error"], doc
    status, doc = get(base, "/api/predict", {**GPT3, "calibrate_json": '[{"run_id": "a", "value": NaN}]'})
    assert status == 400 and "'value' = NaN" in doc["error"], doc
    for params, needle in (({"gpu": "h100-sxm5-80gb", "months": "1e308"},
                            "--months 1e308 is above the largest 1200 this tool plans for"),
                           ({"gpu": "h100-sxm5-80gb", "months": "nan"}, "--months NaN is not a finite number"),
                           ({"gpu": "h100-sxm5-80gb", "memory_gb": "inf"}, "--memory-gb Infinity is not a finite number")):
        status, doc = get(base, "/api/frontier", params)
        assert status == 400 and doc["error"] == needle, doc
        code, _, err = cli(built_store, "frontier", *flags(params))
        assert code == 2 and err.strip() == f"error: {needle}"


@pytest.mark.parametrize("path", ["/../pyproject.toml", "/static/..%2f..%2fpyproject.toml", "/%2e%2e/pyproject.toml",
                                  "/vega-bundle.js/../../pyproject.toml", "/..%5c..%5cpyproject.toml",
                                  "/explorer/index.html", "/pipeline/serve.py", "/api/../pyproject.toml"])
def test_no_file_but_the_page_and_the_bundle(server, path):
    base, _ = server
    status, body = raw(base, "GET", path)
    assert status in (400, 404), (path, status)
    assert b"[project]" not in body and b"import " not in body


def test_the_page_and_the_bundle_are_served_with_a_same_origin_policy(server, built_store):
    base, _ = server
    with urllib.request.urlopen(base + "/", timeout=30) as r:
        page = r.read().decode()
        csp = r.headers["content-security-policy"]
    assert "connect-src 'self'" in csp and "default-src 'self'" in csp
    assert '<script type="text/javascript" src="vega-bundle.js">' in page and "gpt3-175b" in page
    assert "http://" not in page.replace("http://127.0.0.1", "") and "https://" not in page  # no outside address
    with urllib.request.urlopen(base + "/vega-bundle.js", timeout=30) as r:
        bundle = r.read()
    assert bundle == (built_store.parent / "site" / "vega-bundle.js").read_bytes()  # the report site's own


def test_serve_binds_loopback_unless_asked_and_warns(monkeypatch, built_store):
    import pipeline.serve as serve_mod
    from pipeline.cli import app

    seen = {}
    monkeypatch.setattr(serve_mod, "create_app", lambda cfg, **kw: type("A", (), {"app": type("S", (), {
        "state": type("T", (), {"explorer": type("E", (), {"fit": None})})})}))
    monkeypatch.setattr("uvicorn.run", lambda app, host, port, **kw: seen.update(host=host, port=port))
    r = CliRunner().invoke(app, ["--store", str(built_store), "serve"])
    assert r.exit_code == 0, r.output
    assert seen == {"host": "127.0.0.1", "port": 8765} and "warning" not in r.stderr
    r = CliRunner().invoke(app, ["--store", str(built_store), "serve", "--host", "0.0.0.0", "--port", "9000"])
    assert seen == {"host": "0.0.0.0", "port": 9000}
    assert "warning: serving on 0.0.0.0" in r.stderr


# ------------------------------------------------------------------ the page in headless Chromium

MARKS_JS = """(() => {
  const charts = [...document.querySelectorAll('div.chart')];
  const marks = (svg) => [...svg.querySelectorAll('g.role-mark')].reduce((n, g) => n + g.children.length, 0);
  return {busy: window.explorer ? window.explorer.busy : -1, renders: window.explorer ? window.explorer.renders : 0,
          charts: charts.map(c => c.querySelector('svg') ? marks(c.querySelector('svg')) : -1),
          legend: [...document.querySelectorAll('#chart-curve svg text')].map(t => t.textContent).join(' '),
          rows: [...document.querySelectorAll('#layouts td:first-child')].map(t => t.textContent),
          errors: window.explorer ? window.explorer.errors : ['no explorer'], hash: location.hash};
})()"""


def wait_drawn(browser, renders_before: int, timeout: float = 60.0) -> dict:
    deadline, state = time.time() + timeout, None
    while time.time() < deadline:
        state = browser.evaluate(MARKS_JS)
        if state and state["busy"] == 0 and state["renders"] >= renders_before + 3 and all(
                n > 0 for n in state["charts"]):
            return state
        time.sleep(0.25)
    return state


def test_the_page_redraws_as_inputs_change_and_the_url_reopens_the_view(server, browser):
    base, _ = server
    browser.events.clear()
    browser.call("Page.navigate", url=base + "/#gpus=a100-sxm4-80gb&model=gpt3-175b&tokens=3e11&seq_len=2048"
                                               "&policy=strong&global_batch=1536&max_gpus=4096&n=1024&months=3")
    state = wait_drawn(browser, 0)
    assert state and all(n > 0 for n in state["charts"]), state
    assert "a100-sxm4-80gb" in state["legend"] and state["rows"] == ["a100-sxm4-80gb"] and not state["errors"]

    # another accelerator beside the first, and another cluster size: every chart redraws with marks
    browser.evaluate("""(() => {
      const box = [...document.querySelectorAll('#gpu-list input')].find(c => c.value === 'h100-sxm5-80gb');
      box.checked = true; box.dispatchEvent(new Event('change'));
      const n = document.getElementById('n'); n.value = '2048'; n.dispatchEvent(new Event('input'));
      const o = document.getElementById('oversubscription'); o.value = '3'; o.dispatchEvent(new Event('input'));
    })()""")
    state = wait_drawn(browser, state["renders"])
    assert state and all(n > 0 for n in state["charts"]), state
    assert "h100-sxm5-80gb" in state["legend"] and state["rows"] == ["a100-sxm4-80gb", "h100-sxm5-80gb"], state
    assert "gpus=a100-sxm4-80gb%2Ch100-sxm5-80gb" in state["hash"] and "n=2048" in state["hash"]
    assert "oversubscription=3" in state["hash"]
    assert not state["errors"], state["errors"]

    # the address alone reopens the view
    shared = base + "/" + state["hash"]
    browser.call("Page.navigate", url="about:blank")
    browser.call("Page.navigate", url=shared)
    again = wait_drawn(browser, 0)
    assert again and again["rows"] == ["a100-sxm4-80gb", "h100-sxm5-80gb"] and again["hash"] == state["hash"]
    assert browser.evaluate("document.getElementById('n').value") == "2048"
    assert browser.evaluate("document.getElementById('oversubscription').value") == "3"
    errors, requests = browser.problems((base + "/",))
    assert not errors, errors[:3]
    assert not requests, requests[:3]


def test_a_preset_button_loads_its_view(server, browser):
    base, _ = server
    browser.events.clear()
    browser.call("Page.navigate", url=base + "/")
    first = wait_drawn(browser, 0)
    browser.evaluate("document.querySelector('button[data-preset=gtx580]').click()")
    state = wait_drawn(browser, first["renders"])
    assert state and state["rows"] == ["gtx-580-3gb"] and "assumptions=ideal" in state["hash"], state
    errors, requests = browser.problems((base + "/",))
    assert not errors and not requests, (errors[:3], requests[:3])
