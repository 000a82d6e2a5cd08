"""The status pages in a real browser (headless Chromium driven by selenium), against the session's
real ``fleet api`` and a real fleet: a controller and an agent with two simulated GPUs."""

from __future__ import annotations

import os
import shutil
import ssl
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fleet import Client, JobSpec, JobState
from fleet.ops.local import free_port
from tests.conftest import Api, FleetProcs, need, self_signed_cert

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait
except ImportError:  # the browser fixture says what is missing
    webdriver = None  # type: ignore[assignment]

pytestmark = pytest.mark.integration
T = TypeVar("T")
#: the page's colours of a GPU cell (base.html): claimed by a job the reader may see, and free
CLAIMED, FREE = (0xCF, 0xE0, 0xFB), (0xD9, 0xF2, 0xE3)


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module; each test logs in afresh."""
    need(webdriver is not None, "selenium not installed (pip install -e .[dev])")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    need(chromium is not None and driver is not None, "chromium not installed (config/setup-host.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    chrome.set_page_load_timeout(30)
    yield chrome
    chrome.quit()


def login(browser: Any, api: Api, token: str, page: str = "/ui") -> None:
    browser.delete_all_cookies()
    browser.get(f"{api.url}{page}")
    submit_token(browser, token)


def submit_token(browser: Any, token: str) -> None:
    browser.find_element(By.ID, "token").send_keys(token)
    click(browser, "#login")


def click(browser: Any, css: str) -> None:
    """Click what submits a form, and wait for the page it leads to."""
    button = browser.find_element(By.CSS_SELECTOR, css)
    button.click()

    def left(_: Any) -> bool:
        try:
            button.is_enabled()
            return False
        except WebDriverException:  # stale, or (newer Chrome) "does not belong to the document"
            return True

    WebDriverWait(browser, 15).until(left)


def until(check: Callable[[], T | None], timeout: float = 30, why: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except StaleElementReferenceException:  # the page refreshed itself while it was read
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"not seen within {timeout}s: {why}"
        time.sleep(0.25)


def shown(browser: Any, url: str, check: Callable[[Any], T | None], why: str = "") -> T:
    """Load ``url`` until ``check(browser)`` sees what it waits for (the fleet moves on meanwhile)."""

    def load() -> T | None:
        browser.get(url)
        try:
            return check(browser)
        except WebDriverException:  # the live refresh swapped the content under the check: look again
            return None

    return until(load, why=why)


def text(browser: Any, css: str) -> str:
    return "\n".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, css))


def test_logging_in_and_out_with_a_token(browser: Any, api: Api) -> None:
    # Given a user's token, When it opens the queue page without logging in
    token = api.token_for("alice", "a")
    browser.delete_all_cookies()
    browser.get(f"{api.url}/ui/queue")
    # Then it is sent to the login page; a wrong token is refused there, saying why
    assert browser.current_url.startswith(f"{api.url}/ui/login") and "Log in" in browser.title
    submit_token(browser, "fleet_000000000000_" + "x" * 43)
    assert "token unknown, revoked or expired" in text(browser, "[role=alert]")
    assert browser.get_cookie("fleet_token") is None
    # When it logs in with its token, Then it lands on the page it asked for, as itself
    login(browser, api, token, "/ui/queue")
    assert browser.current_url == f"{api.url}/ui/queue"
    assert "alice · tenant a · user" in text(browser, "header .who")
    assert "Nothing is queued in tenant a" in text(browser, "main")
    # And the token is in a cookie scripts cannot read, sent to the pages alone and never cross-site
    cookie = browser.get_cookie("fleet_token")
    kept = {k: cookie[k] for k in ("value", "httpOnly", "sameSite", "path")}
    assert kept == {"value": token, "httpOnly": True, "sameSite": "Strict", "path": "/ui"}
    # And the API itself does not take the cookie: only a token in the Authorization header
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            urllib.request.Request(f"{api.url}/v1/whoami", headers={"Cookie": f"fleet_token={token}"})
        )
    refused.value.close()
    assert refused.value.code == 401
    # When it logs out, Then the cookie is gone and the pages send it to log in again
    click(browser, "header button")
    assert browser.current_url == f"{api.url}/ui/login" and browser.get_cookie("fleet_token") is None
    browser.get(f"{api.url}/ui")
    assert browser.current_url.startswith(f"{api.url}/ui/login")


def test_the_login_cookie_is_secure_over_https_and_no_other_site_can_log_in(api: Api, tmp_path: Path) -> None:
    token = api.token_for("alice", "a")
    form = urllib.parse.urlencode({"token": token, "next": "/ui/queue"}).encode()
    # Given a login form posted from another site, Then it is refused and sets no cookie
    refused = post(f"{api.url}/ui/login", form, Origin="http://evil.example")
    assert refused.status == 403 and "set-cookie" not in refused.headers
    assert "login from another site refused" in refused.body.decode()
    # Given the API serving HTTPS, When one logs in there, Then the cookie is sent over HTTPS only
    cert, key = self_signed_cert(tmp_path)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "fleet",
        "api",
        "--port",
        str(port),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    ]
    env = {**os.environ, "FLEET_REDIS_URL": api.redis_url}
    server = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    try:
        tls = ssl.create_default_context(cafile=str(cert))
        url = f"https://127.0.0.1:{port}/ui/login"
        answer = until(lambda: post(url, form, tls, Origin=f"https://127.0.0.1:{port}"), why="the HTTPS API")
        assert (answer.status, answer.headers["location"]) == (303, "/ui/queue")
        assert "; secure" in answer.headers["set-cookie"].lower()
        assert "httponly" in answer.headers["set-cookie"].lower()
    finally:
        server.terminate()
        server.wait(timeout=10)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_: Any) -> None:
        return None


def post(url: str, body: bytes, tls: ssl.SSLContext | None = None, **headers: str) -> Any:
    """The answer to a form POST itself (a redirect not followed), or None if the server is not up."""
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(
        url, body, {"Content-Type": "application/x-www-form-urlencoded", **headers}
    )
    try:
        with opener.open(request, timeout=10) as answer:
            answer.body = answer.read()
            return answer
    except urllib.error.HTTPError as answer:
        answer.body = answer.read()
        answer.close()
        return answer
    except (urllib.error.URLError, ConnectionError):
        return None


@pytest.fixture
def alices_fleet(procs: FleetProcs, api: Api) -> dict[str, str]:
    """One node with 2 GPUs; tenant a's jobs: one holding GPU 0, one waiting for 2 GPUs, one that
    printed 150 lines and finished. Returns their ids and alice's token."""
    procs.controller()
    procs.agent("n1", gpus=2)
    token = api.token_for("alice", "a")
    alice = api.client(token)
    procs.wait_nodes(alice, 1)
    printer = alice.submit(sh("printer", 'for i in $(seq 1 150); do echo "line $i"; done'))
    assert printer.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    report = 'fleet-progress {"step": 45, "total": 100, "loss": 0.25}'
    hold = alice.submit(sh("hold", f"echo '{report}'; sleep 600", gpus=1))
    until(lambda: hold.status().state == JobState.RUNNING, why="the holding job runs")
    waiter = alice.submit(sh("waiter", "sleep 600", gpus=2))
    until(lambda: waiter.status().reason, why="the waiting job's reason")
    return {"token": token, "hold": hold.id, "waiter": waiter.id, "printer": printer.id}


def sh(name: str, script: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": name, "command": ["sh", "-c", script], **fields})


def test_a_user_sees_the_fleet_as_it_is(
    browser: Any, api: Api, alices_fleet: dict[str, str], client: Client, tmp_path: Path
) -> None:
    ids = alices_fleet
    login(browser, api, ids["token"])
    # Then the overview shows the node, READY, with GPU 0 held by the job (a link to it) and GPU 1 free
    node = shown(browser, f"{api.url}/ui", lambda b: b.find_elements(By.ID, "node-n1"), "node n1")[0]
    assert "READY" in node.find_element(By.CSS_SELECTOR, ".state").text
    gpu0, gpu1 = node.find_elements(By.CSS_SELECTOR, ".gpu")
    assert "GPU 0" in gpu0.text and gpu0.find_element(By.TAG_NAME, "a").text == ids["hold"]
    assert "GPU 1" in gpu1.text and "free" in gpu1.text
    assert "1 of 2 GPUs free" in text(browser, "main > p")
    # And a screenshot shows it: a real image of the window, GPU 0's cell in the claimed colour and
    # GPU 1's in the free one
    shot = tmp_path / "overview.png"
    assert browser.save_screenshot(str(shot))
    width, height, _ = png_pixels(shot.read_bytes(), header_only=True)
    assert (width, height) >= (1000, 700) and shot.stat().st_size > 20_000
    assert dominant(gpu0.screenshot_as_png) == CLAIMED and dominant(gpu1.screenshot_as_png) == FREE

    # And the queue shows the waiting job first in tenant a's queue, with the scheduler's reason
    reason = client.get(ids["waiter"]).reason
    row = shown(
        browser, f"{api.url}/ui/queue", lambda b: b.find_elements(By.CSS_SELECTOR, "tr.queued"), "queue"
    )
    assert len(row) == 1
    cells = [c.text for c in row[0].find_elements(By.TAG_NAME, "td")]
    assert cells[:4] == ["1", "1 of 1", ids["waiter"], "2"] and cells[6].startswith(reason)
    assert "Tenant a · 1 queued" in text(browser, "h2")

    # And the running page shows the holding job, how long it has run and its GPU's utilization
    browser.get(f"{api.url}/ui/running")
    running = browser.find_elements(By.CSS_SELECTOR, "tr.running")
    assert [r.get_attribute("data-job") for r in running] == [ids["hold"]]
    cells = [c.text for c in running[0].find_elements(By.TAG_NAME, "td")]
    assert cells[2] == "RUNNING" and cells[3].endswith("s") and cells[4] == "n1:0 (0%)" and cells[5] == "0%"

    # with the progress its job reported (fleet_worker.progress), drawn as a bar
    def progress_cell(b: Any) -> str | None:
        cell = b.find_elements(By.CSS_SELECTOR, "tr.running td")[-1].text
        return cell if cell != "-" else None

    assert shown(browser, f"{api.url}/ui/running", progress_cell, "the job's progress") == "45%"
    bar = browser.find_element(By.CSS_SELECTOR, "tr.running .progress .used")
    assert bar.get_attribute("style") == "width: 45%;"
    browser.get(f"{api.url}/ui/jobs/{ids['hold']}")
    assert browser.find_element(By.ID, "job-progress").text == "45%"

    # And the finished job's page shows its history and the last 100 lines of its log
    browser.get(f"{api.url}/ui/jobs/{ids['printer']}")
    assert browser.find_element(By.ID, "job-state").text == "SUCCEEDED"
    history = [
        r.find_elements(By.TAG_NAME, "td")[1].text
        for r in browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    ]
    assert history == ["QUEUED", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert browser.find_element(By.ID, "log").text.splitlines() == [f"line {i}" for i in range(51, 151)]
    # And the waiting job's page says where it stands
    browser.get(f"{api.url}/ui/jobs/{ids['waiter']}")
    assert "1st of 1 in tenant a's queue" in browser.find_element(By.ID, "job-position").text
    # And when it is cancelled, the open page shows it within a refresh, without being reloaded
    client.cancel(ids["waiter"])
    until(
        lambda: browser.find_element(By.ID, "job-state").text == "CANCELLED", timeout=15, why="live refresh"
    )
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1


def test_another_tenant_sees_none_of_its_jobs(browser: Any, api: Api, alices_fleet: dict[str, str]) -> None:
    ids = alices_fleet
    # When bob, a user of tenant b, looks at the same fleet
    bob = api.token_for("bob", "b")
    login(browser, api, bob)

    def node_and_gpu0(b: Any) -> tuple[str, str, int] | None:
        """Read in one go: the page's live refresh may replace the elements between two reads."""
        nodes = b.find_elements(By.ID, "node-n1")
        if not nodes:
            return None
        gpu0 = nodes[0].find_elements(By.CSS_SELECTOR, ".gpu")[0]
        return nodes[0].text, gpu0.text, len(gpu0.find_elements(By.TAG_NAME, "a"))

    node, gpu0, links = shown(browser, f"{api.url}/ui", node_and_gpu0, "node n1")
    # Then he sees the node and that GPU 0 is taken, by whom not
    assert "another tenant's job" in gpu0 and links == 0
    assert "1 of other tenants" in node
    # And no page names alice's jobs, nor the fleet's Redis hosts
    for page in ("/ui", "/ui/queue", "/ui/running"):
        browser.get(f"{api.url}{page}")
        assert not any(ids[j] in browser.page_source for j in ("hold", "waiter", "printer")), page
        assert "redis: primary" not in browser.page_source
    browser.get(f"{api.url}/ui/queue")
    assert "Nothing is queued in tenant b" in text(browser, "main")
    # And a job's URL shows him the page an id nobody holds gets (404), not that the job exists
    browser.get(f"{api.url}/ui/jobs/no-such-job")
    unknown = (browser.find_element(By.TAG_NAME, "h1").text, text(browser, "[role=alert]"))
    browser.get(f"{api.url}/ui/jobs/{ids['hold']}")
    seen = (browser.find_element(By.TAG_NAME, "h1").text, text(browser, "[role=alert]"))
    assert seen == (unknown[0], unknown[1].replace("no-such-job", ids["hold"])) and "(404)" in seen[0]
    assert status_of(f"{api.url}/ui/jobs/{ids['hold']}", bob) == 404
    # And so does a job array's, while alice sees its tasks counted by state
    array = api.client(ids["token"]).submit_array(sh("sweep", "true", gpus=3, allow_unplaceable=True), "0-1")
    assert status_of(f"{api.url}/ui/jobs/{array.id}", bob) == 404
    assert "QUEUED 2" in page_text(f"{api.url}/ui/jobs/{array.id}", ids["token"])
    # While an operator sees every tenant's queue
    operator = api.token_for("olga", "ops", "operator")
    assert ids["waiter"] in page_text(f"{api.url}/ui/queue", operator)
    # And which Redis is primary: this fleet's has no replicas
    port = urllib.parse.urlsplit(api.redis_url).port
    assert f"redis: primary 127.0.0.1:{port}, no replicas" in page_text(f"{api.url}/ui", operator)


def status_of(url: str, token: str) -> int:
    try:
        with urllib.request.urlopen(_request(url, token), timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def page_text(url: str, token: str) -> str:
    with urllib.request.urlopen(_request(url, token), timeout=10) as answer:
        return str(answer.read().decode())


def _request(url: str, token: str) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})


# -- a small PNG reader: enough for Chromium's screenshots (8-bit RGB or RGBA, not interlaced) ---------


def png_pixels(data: bytes, header_only: bool = False) -> tuple[int, int, list[bytes]]:
    """Width, height and each row's RGB(A) bytes (no rows with ``header_only``)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, "unexpected PNG format"
            bpp = 3 if colour == 2 else 4
            if header_only:
                return width, height, []
        elif kind == b"IDAT":
            idat += body
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prior = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left, up, corner = line[i - bpp] if i >= bpp else 0, prior[i], prior[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + _predict(kind, left, up, corner)) & 0xFF
        rows.append(bytes(line))
        prior = line
    return width, height, rows


def _predict(kind: int, left: int, up: int, corner: int) -> int:
    if kind == 0:
        return 0
    if kind == 1:
        return left
    if kind == 2:
        return up
    if kind == 3:
        return (left + up) // 2
    guess = left + up - corner
    return min((abs(guess - left), 0, left), (abs(guess - up), 1, up), (abs(guess - corner), 2, corner))[2]


def dominant(data: bytes) -> tuple[int, int, int]:
    """The colour most pixels of a PNG have."""
    width, _, rows = png_pixels(data)
    bpp = len(rows[0]) // width
    counts: dict[tuple[int, int, int], int] = {}
    for row in rows:
        for x in range(0, len(row), bpp):
            pixel = (row[x], row[x + 1], row[x + 2])
            counts[pixel] = counts.get(pixel, 0) + 1
    return max(counts, key=lambda c: counts[c])
