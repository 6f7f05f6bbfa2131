"""`gpuportal templates` against the live portal: save a spec file, list it, and `show` it back
as YAML that `gpuportal submit` takes; a refused spec names its field; a shared template is
found by its tenant's members and another tenant's reads as not found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from portal.accounts.services import create_api_token
from portal.jobs.models import Job, JobTemplate

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SPEC = """\
name: train-resnet
vc: vision
flavor: s-A100
command: python train.py --epochs 3
env:
  DATASET: imagenet
"""


@pytest.fixture
def tokens(users: dict[str, Any]) -> dict[str, str]:
    return {name: create_api_token(users[name], "templates test")[1] for name in ("alice", "bob", "carol")}


def test_save_list_show_and_submit(run_cli: Any, tokens: dict[str, str], tmp_path: Path) -> None:
    alice = tokens["alice"]
    (tmp_path / "job.yaml").write_text(SPEC)
    saved = run_cli(alice, "templates", "save", "train", "job.yaml", "--shared", "--description", "ResNet")
    assert saved.returncode == 0, saved.stderr
    assert "Template train saved, shared with tenant vision." in saved.stderr and not saved.stdout

    listed = run_cli(alice, "templates")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[1].split() == ["train", "alice", "yes", "ResNet"]
    as_json = json.loads(run_cli(alice, "templates", "-o", "json").stdout)
    assert [(t["name"], t["owner"], t["shared"]) for t in as_json] == [("train", "alice", True)]

    shown = run_cli(alice, "templates", "show", "train")
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout) == yaml.safe_load(SPEC)
    (tmp_path / "again.yaml").write_text(shown.stdout)
    submitted = run_cli(alice, "submit", "again.yaml", "-q")
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(pk=int(submitted.stdout))
    assert (job.name, job.spec["env"]) == ("train-resnet", {"DATASET": "imagenet"})

    # A peer finds the shared template by its name, or by its owner's.
    assert run_cli(tokens["bob"], "templates", "show", "alice/train").returncode == 0
    assert (
        json.loads(run_cli(tokens["bob"], "templates", "show", "train", "-o", "json").stdout)["vc"]
        == "vision"
    )
    assert run_cli(tokens["bob"], "templates", "delete", "train").returncode == 4
    foreign = run_cli(tokens["carol"], "templates", "show", "train")
    assert foreign.returncode == 3 and "template train not found" in foreign.stderr

    assert run_cli(alice, "templates", "delete", "train").returncode == 0
    assert not JobTemplate.objects.exists()
    assert run_cli(alice, "templates", "delete", "train").returncode == 3


def test_a_refused_spec_names_its_field(run_cli: Any, tokens: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(SPEC.replace("vc: vision", "vc: nope"))
    refused = run_cli(tokens["alice"], "templates", "save", "train", "job.yaml")
    assert refused.returncode == 2
    assert "spec.vc: No virtual cluster named 'nope' that you can submit to." in refused.stderr
    missing = run_cli(tokens["alice"], "templates", "save", "train", "none.yaml")
    assert missing.returncode == 2 and "cannot read none.yaml" in missing.stderr
    assert not JobTemplate.objects.exists()
