"""Saves the main pages of the web app to docs/screenshots/.

    python -m tests.browser.screenshots

Runs itself through pytest on private PostgreSQL and Redis (portal.devstack), with the live
stack, the demo cast and two simulated GPU hosts, submits a few jobs, and photographs the pages
at laptop and phone width. Pytest only collects this file when it is named, so `make test` skips it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import sign_in

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
LAPTOP = {"width": 1366, "height": 860}
PHONE = {"width": 390, "height": 844}

TRAIN = (
    "import math, random, time\n"
    "for step in range(100000):\n"
    "    loss = 2.5 * math.exp(-step / 400) + random.random() * 0.05\n"
    "    print(f'epoch {step // 100} step {step} loss {loss:.4f} lr 3e-4', flush=True)\n"
    "    time.sleep(0.4)\n"
)
EVAL = (
    "for i in range(5):\n    print(f'eval batch {i}: top1 0.7{i}', flush=True)\nprint('done', flush=True)\n"
)


def main() -> int:
    from portal.devstack import main as devstack

    return devstack(["test", str(Path(__file__).resolve()), "-q", "-p", "no:randomly"])


@pytest.fixture
def hosts(users: Any, start_agent: Any) -> list[Any]:
    from portal.cluster.models import Node
    from tests.conftest import wait_for

    names = ["a100-node-1", "v100-node-1"]
    agents = [start_agent(name) for name in names]
    ready = Node.objects.filter(name__in=names, state="ready")
    wait_for(lambda: ready.count() == len(names), 30, "the agents to say hello")
    return agents


async def job_state(page: Page, base: str, job_id: int) -> str:
    response = await page.request.get(f"{base}/api/v1/jobs/{job_id}/")
    return str((await response.json())["state"])


async def wait_state(page: Page, base: str, job_id: int, states: set[str]) -> None:
    for _ in range(240):
        if await job_state(page, base, job_id) in states:
            return
        await page.wait_for_timeout(500)
    raise AssertionError(f"job {job_id} never reached {states}")


async def shot(page: Page, name: str) -> None:
    await page.wait_for_load_state("networkidle")
    await page.wait_for_timeout(400)
    await page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
    print(f"saved docs/screenshots/{name}.png", flush=True)


@pytest.mark.live
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio(loop_scope="session")
async def test_take_screenshots(live_stack: dict[str, Any], hosts: Any, submit_as: Any, page: Page) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    base = live_stack["http"]
    await page.set_viewport_size(LAPTOP)
    await page.goto(base + "/")
    await expect(page.get_by_label("User name")).to_be_visible()
    await shot(page, "01-sign-in")
    await sign_in(page, base, "alice")

    py = ["python3", "-c"]
    done = await submit_as("alice", name="quick-eval", command=[*py, EVAL])
    await wait_state(page, base, done["id"], {"succeeded", "failed"})
    await submit_as(
        "alice", name="broken-config", command=[*py, "print('KeyError: lr', flush=True); raise SystemExit(2)"]
    )
    train = await submit_as("alice", name="resnet50-imagenet", flavor="m-A100", command=[*py, TRAIN])
    await submit_as("alice", name="sweep-lr-0.1", command=[*py, TRAIN], priority="dev")
    await wait_state(page, base, train["id"], {"running"})
    waiting = await submit_as("alice", name="vit-large-pretrain", flavor="l-A100", command=[*py, TRAIN])
    await submit_as("bob", name="bert-finetune", flavor="l-A100", command=[*py, TRAIN])
    await submit_as("bob", name="speech-style-v100", flavor="s-V100", command=[*py, TRAIN])
    await page.wait_for_timeout(6000)  # a few telemetry samples and a scheduling cycle for the reasons

    await page.goto(base + "/")
    await shot(page, "02-dashboard")
    await page.goto(base + "/submit")
    await page.get_by_label("Name", exact=True).fill("resnet50-imagenet")
    await page.get_by_role("radio", name="m-A100").check()
    await page.get_by_label("Command", exact=True).fill("python train.py --epochs 90")
    await page.get_by_label("Image").fill("registry.example.org/ml/pytorch:24.10")
    await page.get_by_role("button", name="Add variable").click()
    await page.get_by_label("Variable 1 name").fill("WANDB_MODE")
    await page.get_by_label("Variable 1 value").fill("offline")
    await shot(page, "03-submit-form")
    await page.get_by_role("tab", name="YAML").click()
    editor = page.get_by_label("Job spec (YAML)")
    await editor.fill((await editor.input_value()) + "replicas: 100\n")
    await page.get_by_role("button", name="Submit job").click()
    await expect(page.get_by_role("alert")).to_be_visible()
    await shot(page, "04-submit-yaml-error")
    await page.goto(base + "/jobs")
    await shot(page, "05-jobs")
    await page.goto(f"{base}/jobs/{train['id']}")
    await page.wait_for_timeout(5000)
    await shot(page, "06-job-running")
    await page.goto(f"{base}/jobs/{waiting['id']}")
    await shot(page, "07-job-pending")
    await page.goto(base + "/cluster")
    await shot(page, "08-cluster")
    await page.goto(base + "/vcs/vision")
    await shot(page, "09-virtual-cluster")
    await page.goto(base + "/tokens")
    await page.get_by_label("Name").fill("laptop")
    await page.get_by_role("button", name="Create token").click()
    await expect(page.get_by_text("shown only once")).to_be_visible()
    await shot(page, "13-tokens")
    await page.goto(base + "/usage?group=user")
    await expect(page.get_by_role("table")).to_contain_text("alice")
    await shot(page, "14-usage")
    await page.goto(f"{base}/jobs/{train['id']}")
    await page.get_by_role("button", name="Shell").click()
    terminal = page.get_by_role("application", name=f"Shell in job {train['id']}")
    await expect(page.get_by_role("status").filter(has_text="connected")).to_be_visible()
    await terminal.click()
    await page.keyboard.type("echo $CUDA_VISIBLE_DEVICES | tr , '\\n'; ls")
    await page.keyboard.press("Enter")
    await expect(terminal).to_contain_text("stdout.log")
    await terminal.scroll_into_view_if_needed()
    await shot(page, "15-job-shell")

    await page.set_viewport_size(PHONE)
    await page.goto(base + "/")
    await shot(page, "10-phone-dashboard")
    await page.goto(f"{base}/jobs/{train['id']}")
    await page.wait_for_timeout(2000)
    await shot(page, "11-phone-job")
    await page.goto(base + "/jobs")
    await shot(page, "12-phone-jobs")


if __name__ == "__main__":
    sys.exit(main())
