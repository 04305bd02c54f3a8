"""The --cost-model switch: kinds, env var, the trained artifact, the missing-artifact message, reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from learned.artifact import (
    ArtifactCostModel,
    MissingArtifactError,
    TrainingInputs,
    load_cost_model,
    train_artifact,
    train_main,
)
from learned.choice import kind_from
from learned.evaluate import ATTENTION_CSV, VIDUR_ROOT
from learned.gnn import GnnConfig
from service.cli.main import main
from service.cluster.spec import load_cluster_spec
from service.domain.model_config import MODEL_CONFIGS
from service.sim.iteration import IterationCostTable, iteration_ops
from tests.conftest import data_path, needs_data

VIDUR = data_path(VIDUR_ROOT.as_posix())
pytestmark = needs_data("vidur-profiling")
# A tiny training set: two models on the A100 (internlm-20b is the held-out one), its attention
# and CPU-overhead profiles; two epochs on a few hundred graphs (a few seconds).
TINY_FILES = ("compute/a100/microsoft/phi-2/mlp.csv", "compute/a100/internlm/internlm-20b/mlp.csv",
              "legacy-a100/cpu_overheads.csv")
TINY_CONFIG = GnnConfig(epochs=2, hidden=16, batch_graphs=64)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainingInputs, Path, Path]:
    """(inputs, cache dir, artifact folder): trained once per session into a tmp cache."""
    root = tmp_path_factory.mktemp("cost-model")
    data = root / "data"
    for rel in TINY_FILES:
        (data / VIDUR_ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(VIDUR / rel, data / VIDUR_ROOT / rel)
    inputs = TrainingInputs(data, (), TINY_CONFIG, 400, slice_tokens_per_model=3)
    cache = root / "cache"
    return inputs, cache, train_artifact(inputs, cache, progress=lambda _: None)


def test_kind_from_flag_env_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLICESCHED_COST_MODEL", raising=False)
    assert kind_from(None) == "learned"
    monkeypatch.setenv("SLICESCHED_COST_MODEL", "table")
    assert kind_from(None) == "table"
    assert kind_from("gnn") == "gnn"  # the flag wins over the env
    monkeypatch.setenv("SLICESCHED_COST_MODEL", "magic")
    with pytest.raises(Exception, match="unknown cost model 'magic'"):
        kind_from(None)


@pytest.mark.slow
def test_artifact_records_choice_evidence_and_overheads(tiny: tuple[TrainingInputs, Path, Path]) -> None:
    inputs, _, target = tiny
    assert target.name == f"learned-{inputs.key()}"
    meta = json.loads((target / "meta.json").read_text())
    evidence = meta["evidence"]["per_device_kind"]["A100-80GB"]
    assert set(evidence) == {"gnn", "table", "roofline"} and evidence["gnn"]["n"] > 0
    # whole iterations are chosen by the held-out iterations (decodes and prefills as the simulator prices them)
    iterations = meta["iteration_evidence"]["per_device_kind"]["A100-80GB"]
    assert set(iterations) == {"gnn", "table", "roofline"} and iterations["gnn"]["decode"]["n"] > 0
    better = "gnn" if iterations["gnn"]["mape_pct"] < iterations["table"]["mape_pct"] else "table"
    assert meta["choice"] == {"A100-80GB": better}
    # the held-out model's traced slices (6 kinds on each row of 3 token counts), priced by each model
    on_slices = meta["slice_evidence"]["per_device_kind"]["A100-80GB"]
    assert set(on_slices) == {"gnn", "table", "roofline"}
    assert on_slices["gnn"]["n"] >= 18 and on_slices["gnn"]["n"] % 6 == 0
    assert len(meta["gnn_quantile_shift"]["p90_p99_log"]) == 2
    assert meta["overheads"]["A100-80GB"]["per_iteration_s"] > 0
    assert not (inputs.data_dir / ATTENTION_CSV).exists()  # the tiny set trains without it
    # the data files by data-folder path and digest, not where they were found
    assert sorted(meta["inputs"]["files"]) == sorted((VIDUR_ROOT / rel).as_posix() for rel in TINY_FILES)


@pytest.mark.parametrize("kind", ["learned", "gnn", "table", "roofline"])
def test_each_kind_builds_and_costs_an_iteration(kind: str, tiny: tuple[TrainingInputs, Path, Path]) -> None:
    inputs, cache, target = tiny
    loaded = load_cost_model(kind, cache_dir=cache, inputs=inputs)
    assert loaded.describe()["kind"] == kind
    if kind == "roofline":
        assert loaded.artifact is None and loaded.sha256 is None
    else:
        assert loaded.artifact == target and loaded.sha256 and len(loaded.sha256) == 64
        assert isinstance(loaded.model, ArtifactCostModel)
    device = load_cluster_spec("8xA100-nvlink").devices[0]
    table = IterationCostTable(MODEL_CONFIGS["llama2-7b"], loaded.model, device)
    decode = table.latency_s(0, 0, 0, 0, 32, 32 * 500)
    prefill = table.latency_s(2048, 2048 * 1024, 2048, 1, 0, 0)
    assert 0 < decode < prefill < 10
    if kind != "roofline":  # host overheads are part of the model
        assert table.overhead.per_iteration_s > 0


def test_stacked_layers_cost_the_same_as_unrolled(tiny: tuple[TrainingInputs, Path, Path]) -> None:
    inputs, cache, _ = tiny
    model = load_cost_model("gnn", cache_dir=cache, inputs=inputs).model
    device = load_cluster_spec("8xA100-nvlink").devices[0]
    config = MODEL_CONFIGS["llama2-7b"]
    table = IterationCostTable(config, model, device)
    from service.sim.iteration import BatchFeatures

    batch = BatchFeatures.of([(300, 0)], [700, 90, 1200])
    unrolled = model.predict(iteration_ops(config, batch), device).p50_s
    assert table.exact_s(batch) - table.overhead.seconds(1, 3) == pytest.approx(unrolled, rel=1e-4)


def test_missing_artifact_names_the_command(tmp_path: Path, tiny: tuple[TrainingInputs, Path, Path],
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    inputs, _, _ = tiny
    with pytest.raises(MissingArtifactError, match="slicesched cost-model train"):
        load_cost_model("learned", cache_dir=tmp_path / "empty", inputs=inputs)
    monkeypatch.setenv("SLICESCHED_COST_MODEL_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("SLICESCHED_COST_MODEL", raising=False)
    code = main(["replay", "--duration", "5", "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "slicesched cost-model train" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_replay_report_names_its_cost_model(tmp_path: Path, tiny: tuple[TrainingInputs, Path, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, cache, target = tiny
    monkeypatch.setattr("learned.artifact.default_inputs", lambda: inputs)
    monkeypatch.setenv("SLICESCHED_COST_MODEL_DIR", str(cache))
    monkeypatch.delenv("SLICESCHED_COST_MODEL", raising=False)
    out = tmp_path / "out"
    assert main(["replay", "--tenants", "a100-4tenants", "--duration", "5", "--policy", "fifo/container",
                 "--out", str(out)]) == 0
    described = json.loads((out / "report.json").read_text())["config"]["cost_model"]
    assert described["kind"] == "learned" and described["artifact"] == str(target)
    assert described["sha256"] == load_cost_model("learned", cache_dir=cache, inputs=inputs).sha256
    meta = json.loads((target / "meta.json").read_text())
    assert described["choice"] == meta["choice"] and described["slice_choice"] == meta["slice_choice"]
    out2 = tmp_path / "out2"
    assert main(["replay", "--duration", "5", "--policy", "fifo/container", "--cost-model", "roofline",
                 "--out", str(out2)]) == 0
    assert json.loads((out2 / "report.json").read_text())["config"]["cost_model"] == \
        {"kind": "roofline", "artifact": None, "sha256": None}


@pytest.mark.slow
def test_train_command_makes_a_loadable_artifact(tmp_path: Path, tiny: tuple[TrainingInputs, Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    inputs, _, _ = tiny
    cache = tmp_path / "cache"
    args = ["--data-dir", str(inputs.data_dir), "--cache-dir", str(cache), "--epochs", "1",
            "--max-train-samples", "200", "--slice-tokens", "3"]
    assert train_main(args) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    again = TrainingInputs(inputs.data_dir, (), GnnConfig(epochs=1), 200, 3)
    loaded = load_cost_model("gnn", cache_dir=cache, inputs=again)
    assert str(loaded.artifact) == printed["artifact"] and loaded.sha256 == printed["sha256"]
    assert train_main(args) == 0  # present: not retrained
    assert "artifact exists" in capsys.readouterr().err


def test_live_service_takes_its_cost_model_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         tiny: tuple[TrainingInputs, Path, Path]) -> None:
    from service.domain.error import InvalidInputError
    from service.live.service import LiveService
    from service.live.settings import ServiceSettings

    monkeypatch.setenv("SLICESCHED_COST_MODEL", "table")
    assert ServiceSettings.from_env(admin_key="a" * 20).cost_model == "table"
    with pytest.raises(InvalidInputError, match="unknown cost model"):
        ServiceSettings(admin_key="a" * 20, cost_model="magic")
    inputs, cache, _ = tiny
    monkeypatch.setattr("learned.artifact.default_inputs", lambda: inputs)
    monkeypatch.setenv("SLICESCHED_COST_MODEL_DIR", str(cache))
    assert LiveService(ServiceSettings(admin_key="a" * 20, cost_model="gnn")).cost_model.name == "gnn"
    monkeypatch.setenv("SLICESCHED_COST_MODEL_DIR", str(tmp_path / "empty"))
    with pytest.raises(MissingArtifactError, match="slicesched cost-model train"):
        LiveService(ServiceSettings(admin_key="a" * 20))  # the default: learned, never the roofline
