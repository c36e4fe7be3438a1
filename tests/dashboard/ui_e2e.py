"""The `/ui` dashboard in a real headless Chromium (Debian's `chromium` + `chromium-driver`,
driven by selenium from .venv/ui). Run by tests/tests/dashboard.rs, one scenario per process:

    python ui_e2e.py SCENARIO

Environment: UI_URL (http://host:port of `agentrun serve --listen`), UI_KEY (its API key),
AGENTRUN (the agentrun binary) with AGENTRUN_STATE_DIR (the daemon's state: `agentrun exec`
runs go through that daemon), UI_SCREENSHOT (where the screenshot scenario saves its PNG),
CHROMIUM / CHROMEDRIVER (default /usr/bin/chromium, /usr/bin/chromedriver: given explicitly,
so selenium-manager never looks for a driver on the network). Prints "OK SCENARIO" at the
end; any failed check raises (non-zero exit, traceback).
"""

import os
import subprocess
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.support.wait import WebDriverWait
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

URL = os.environ["UI_URL"].rstrip("/")
KEY = os.environ.get("UI_KEY", "")
AGENTRUN = os.environ.get("AGENTRUN", "agentrun")
# Bounded waits: the page polls every second; a debug daemon on 2 shared cores.
WAIT = 20.0


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in (
        "--headless=new",
        "--no-sandbox",  # root, in a container-less CI: Chromium's own sandbox needs a user
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--lang=en-US",
    ):
        opts.add_argument(a)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(service=service, options=opts)
    d.set_page_load_timeout(30)
    return d


def wait_for(what, f, timeout=WAIT):
    """Polls f() until it returns a true value; raises with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = f()
            if v:
                return v
            last = v
        except StaleElementReferenceException as e:  # the table was redrawn meanwhile
            last = e
        except NoSuchElementException as e:  # the next page (a form's answer) not loaded yet
            last = e
        except WebDriverException as e:  # an element of the page being replaced
            if "does not belong to the document" not in str(e):
                raise
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def text(d, id_):
    return d.find_element(By.ID, id_).text


def rows(d, table):
    """The rows of table `table` as lists of cell texts, with their data-* attributes."""
    out = []
    for tr in d.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr"):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        out.append((cells, tr))
    return out


def login(d, key=KEY):
    d.get(URL + "/ui")
    field = d.find_element(By.ID, "key")
    assert not d.find_elements(By.ID, "pools"), "the page shows data before the login"
    field.send_keys(key)
    page = d.find_element(By.TAG_NAME, "html")
    d.find_element(By.CSS_SELECTOR, "#login button").click()
    # The form posts: wait until its answer has replaced this page, so that what the caller
    # looks for next is on the answer, not on the form being left.
    WebDriverWait(d, WAIT).until(lambda _: gone(page))


def gone(element):
    """Whether `element`'s document has been replaced. chromedriver says so with a stale
    element error, or, caught mid-navigation, with "Node with given id does not belong to the
    document" (an unknown error, which selenium's `staleness_of` lets through)."""
    try:
        element.is_enabled()
        return False
    except StaleElementReferenceException:
        return True
    except WebDriverException as e:
        if "does not belong to the document" in str(e):
            return True
        raise


def logged_in(d):
    login(d)
    wait_for("the dashboard after the login", lambda: d.find_elements(By.ID, "pools"))
    wait_for("status live", lambda: text(d, "status") == "live")


def agentrun_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("AGENTRUN_NO_DAEMON", None)
    return env


def spawn(*argv):
    return subprocess.Popen(
        [AGENTRUN, "exec", "--", *argv],
        env=agentrun_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run(*argv):
    subprocess.run([AGENTRUN, "exec", "--", *argv], env=agentrun_env(), check=True,
                   timeout=60, stdout=subprocess.DEVNULL)


def end(p):
    """Ends an `agentrun exec` client (the daemon kills its run: the client is gone)."""
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def sleep_row(d):
    for cells, tr in rows(d, "commands"):
        if "sleep 20" in cells[3]:
            return cells, tr
    return None


# --- scenarios --------------------------------------------------------------------------------


def scenario_login():
    """The login form, then the page with the daemon's pool; the cookie holds no key."""
    d = browser()
    try:
        logged_in(d)
        pools = wait_for("a pool row", lambda: rows(d, "pools"))
        cells = pools[0][0]
        assert cells[0] == "host" and cells[1] == "default", cells
        ready, target = (int(x) for x in cells[2].split(" / "))
        assert target == 1 and 0 <= ready <= 1, cells
        assert text(d, "stat-shells").endswith("/ 64"), text(d, "stat-shells")
        assert "MiB" in text(d, "stat-memory") or "GiB" in text(d, "stat-memory"), text(d, "stat-memory")
        # The session cookie, and the login form's CSRF cookie (as strict).
        cookies = d.get_cookies()
        assert sorted(c["name"] for c in cookies) == ["agentrun_ui", "agentrun_ui_login"], cookies
        for c in cookies:
            assert c["httpOnly"] and c["sameSite"] == "Strict" and c["path"] == "/ui", c
        c = next(c for c in cookies if c["name"] == "agentrun_ui")
        assert c["name"] == "agentrun_ui" and c["httpOnly"] and c["sameSite"] == "Strict", c
        assert c["path"] == "/ui" and KEY not in c["value"], c
        # The JSON endpoint answers the browser's session.
        d.get(URL + "/ui/api/snapshot")
        body = d.find_element(By.TAG_NAME, "body").text
        assert '"pools"' in body and '"window"' in body, body[:300]
        # Signing out ends the session: the form again.
        d.get(URL + "/ui")
        wait_for("the page", lambda: d.find_elements(By.CSS_SELECTOR, "form.logout button"))
        d.find_element(By.CSS_SELECTOR, "form.logout button").click()
        wait_for("the login form after sign-out", lambda: d.find_elements(By.ID, "key"))
        d.get(URL + "/ui/api/snapshot")
        body = d.find_element(By.TAG_NAME, "body").text
        assert "MISSING_API_KEY" in body and '"pools"' not in body, body[:300]
    finally:
        d.quit()


def scenario_wrong_key():
    """A wrong key: the form again with an error, no cookie, no data anywhere."""
    d = browser()
    try:
        login(d, key=KEY + "x")
        wait_for("the error", lambda: text(d, "login-error") == "Wrong API key.")
        assert not d.find_elements(By.ID, "pools")
        # No session: only the login form's CSRF cookie.
        assert [c["name"] for c in d.get_cookies()] == ["agentrun_ui_login"], d.get_cookies()
        for path in ("/ui/api/snapshot", "/ui/api/audit", "/ui/api/denials"):
            d.get(URL + path)
            body = d.find_element(By.TAG_NAME, "body").text
            assert "MISSING_API_KEY" in body, (path, body[:300])
            assert "pools" not in body and "sandbox_id" not in body, (path, body[:300])
        d.get(URL + "/ui/app.js")
        assert "MISSING_API_KEY" in d.find_element(By.TAG_NAME, "body").text
    finally:
        d.quit()


def scenario_live():
    """A run started after the page loaded shows in the running table and leaves it when it
    ends; a few runs move runs/s, the run counter and the sparklines, without a reload."""
    d = browser()
    p = None
    try:
        logged_in(d)
        assert not sleep_row(d)
        runs_before = int(text(d, "stat-runs"))
        p = spawn("sleep", "20")
        cells, tr = wait_for("`sleep 20` in the running table", lambda: sleep_row(d))
        sandbox, kind, profile, command, elapsed, cpu, memory = cells
        assert kind == "run" and profile == "default" and command == "sleep 20", cells
        assert sandbox.startswith("ar-"), cells
        assert tr.get_attribute("data-id").startswith("run-"), tr.get_attribute("data-id")
        assert elapsed.endswith(" s"), cells
        assert memory.endswith("iB") or memory.endswith(" B"), cells
        assert int(text(d, "stat-running")) >= 1
        # The pool's row counts the shell the run took as running.
        wait_for("the pool's running shell", lambda: int(rows(d, "pools")[0][0][3]) >= 1)
        discarded_before = int(rows(d, "pools")[0][0][6])
        # Elapsed time moves while the page stays.
        first = float(elapsed.split()[0])
        wait_for("elapsed to grow", lambda: sleep_row(d) and float(sleep_row(d)[0][4].split()[0]) >= first + 1.5)
        end(p)
        p = None
        wait_for("the ended run to leave the table", lambda: not sleep_row(d))
        # A run its time limit kills: its shell is discarded, counted in its pool's row.
        timed_out = subprocess.run([AGENTRUN, "exec", "--timeout", "1s", "--", "sleep", "30"],
                                   env=agentrun_env(), capture_output=True, timeout=60)
        assert timed_out.returncode == 124, timed_out
        wait_for("the timed-out run's shell discarded", lambda: int(rows(d, "pools")[0][0][6]) > discarded_before)
        for _ in range(5):
            run("true")
        wait_for("5 more runs in the minute's count", lambda: int(text(d, "stat-runs")) >= runs_before + 5)
        wait_for("runs/s above 0", lambda: float(text(d, "stat-runs-per-s")) > 0)
        assert text(d, "stat-p50") != "–" and text(d, "stat-p99") != "–"
        spark = d.find_element(By.ID, "spark-runs")
        assert int(spark.get_attribute("data-points")) == 60, spark.get_attribute("data-points")
        assert float(spark.get_attribute("data-max")) >= 1, spark.get_attribute("data-max")
        lat = d.find_element(By.ID, "spark-latency")
        assert int(lat.get_attribute("data-points")) >= 1
        d_attr = spark.find_element(By.CSS_SELECTOR, "path.line").get_attribute("d")
        assert d_attr.count("L") >= 59, d_attr
    finally:
        if p is not None:
            end(p)
        d.quit()


def search(d, **fields):
    form = d.find_element(By.ID, "audit-form")
    for name in ("since", "until", "sandbox", "rule", "q", "limit"):
        el = form.find_element(By.NAME, name)
        el.clear()
        el.send_keys(fields.get(name, "200" if name == "limit" else ""))
    for name in ("kind", "decision"):
        Select(form.find_element(By.NAME, name)).select_by_value(fields.get(name, ""))
    d.execute_script("document.getElementById('audit-count').removeAttribute('data-count')")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(
        f"the search {fields} to answer",
        lambda: d.find_element(By.ID, "audit-count").get_attribute("data-count") is not None
        or text(d, "audit-error"),
    )
    return rows(d, "audit")


def scenario_filter():
    """The audit search: decision=deny shows only denials, sandbox=ID only that sandbox's
    records, kind=run only runs (each with its trace linked to its records); a bad value
    shows the API's error; the denial feed shows the denial."""
    d = browser()
    try:
        logged_in(d)
        everything = search(d)
        decisions = {tr.get_attribute("data-decision") for _, tr in everything}
        assert "deny" in decisions and "ran" in decisions, decisions
        denied = search(d, decision="deny")
        assert denied, "no denial found"
        for cells, tr in denied:
            assert tr.get_attribute("data-decision") == "deny", cells
        assert any("evil.example" in c[5] and c[6] == "network.default" for c, _ in denied), [c for c, _ in denied]
        sandbox = denied[0][1].get_attribute("data-sandbox")
        evil = next(tr for c, tr in denied if "evil.example" in c[5])
        trace = evil.find_element(By.CSS_SELECTOR, "a.trace").get_attribute("data-trace")
        assert len(trace) == 32, trace
        assert sandbox.startswith("ar-"), sandbox
        mine = search(d, sandbox=sandbox)
        assert len(mine) >= 2, [c for c, _ in mine]  # the denial and its run at least
        for cells, tr in mine:
            assert tr.get_attribute("data-sandbox") == sandbox, cells
        assert len(mine) < len(everything), (len(mine), len(everything))
        by_rule = search(d, rule="network.default", decision="deny")
        assert by_rule and all(c[6] == "network.default" for c, _ in by_rule)
        by_text = search(d, q="EVIL.example")
        assert by_text and all("evil.example" in c[5] for c, _ in by_text), [c for c, _ in by_text]
        none = search(d, since="2h", until="1h")
        assert none == [], [c for c, _ in none]
        recent = search(d, since="10m", kind="run")
        assert recent and all(tr.get_attribute("data-kind") == "run" for _, tr in recent)
        # A bad value: the API's one-line error, no rows.
        bad = search(d, limit="0")
        assert bad == [] and "limit" in text(d, "audit-error"), text(d, "audit-error")
        # The denial's run: its trace link shows that trace's records only.
        runs = search(d, kind="run", sandbox=sandbox)
        links = [tr.find_element(By.CSS_SELECTOR, "a.trace") for _, tr in runs]
        link = next((a for a in links if a.get_attribute("data-trace") == trace), None)
        assert link is not None, ("no run record of trace", trace, [c for c, _ in runs])
        link.click()
        wait_for("the trace page", lambda: d.current_url.endswith("/ui/trace/" + trace))
        wait_for("the trace title", lambda: trace in text(d, "audit-title"))
        wait_for("the trace's records", lambda: rows(d, "audit"))
        traced = rows(d, "audit")
        kinds = {tr.get_attribute("data-kind") for _, tr in traced}
        assert kinds >= {"run", "decision"}, kinds
        for cells, tr in traced:
            a = tr.find_element(By.CSS_SELECTOR, "a.trace")
            assert a.get_attribute("data-trace") == trace, cells
        # The denial feed.
        feed = wait_for("the denial feed", lambda: d.find_elements(By.CSS_SELECTOR, "#denials li"))
        assert any("network.default" in li.text and "evil.example" in li.text for li in feed), [li.text for li in feed]
    finally:
        d.quit()


def scenario_screenshot():
    """The whole page with a running command, the denial feed and the audit table, as a PNG."""
    path = os.environ["UI_SCREENSHOT"]
    d = browser()
    p = None
    try:
        logged_in(d)
        p = spawn("sleep", "20")
        wait_for("`sleep 20` in the running table", lambda: sleep_row(d))
        wait_for("the denial feed", lambda: d.find_elements(By.CSS_SELECTOR, "#denials li"))
        wait_for("audit rows", lambda: rows(d, "audit"))
        height = d.execute_script("return document.documentElement.scrollHeight")
        d.set_window_size(1400, min(max(int(height) + 40, 1000), 4000))
        time.sleep(1.2)  # one more poll at the new size
        assert d.save_screenshot(path), path
        print("SCREENSHOT", path)
    finally:
        if p is not None:
            end(p)
        d.quit()


if __name__ == "__main__":
    name = sys.argv[1]
    globals()["scenario_" + name]()
    print("OK", name)
