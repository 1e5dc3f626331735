"""`draftsmith export` through the CLI on a drafter shaped for the embedded default target
(SmolLM2-135M, 30 layers): reload gives identical logits, and on the real target the layers
vLLM and SGLang would capture (read the engines' way) are the trained [2, 15, 27]."""

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.vocab import build_vocab
from draftsmith.draft.checkpoint import load_drafter, save_drafter
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.runtime.capture import capture
from draftsmith.target import embed_weight, text_config
from tests.engine_readers import sglang_view, vllm_view

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def drafter_dir(smollm2, tmp_path_factory):
    info = smollm2.info
    torch.manual_seed(0)
    model = Eagle3Drafter(DrafterConfig.from_target(text_config(smollm2.model.config), 512, info.default_aux_layers))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.load_target_embeddings(embed_weight(smollm2.model).float())
    model.set_vocab(*build_vocab(np.random.RandomState(0).randint(0, 100, info.vocab_size), 512))
    folder = tmp_path_factory.mktemp("export") / "drafter"
    save_drafter(model, folder, target=info.to_dict(), meta={"dataset": "random weights for an export test"})
    return model.eval(), folder


@pytest.mark.parametrize("fmt,engine,reader", [("eagle", "sglang", sglang_view), ("speculators", "vllm", vllm_view)])
def test_export_cli_on_the_default_target(smollm2, drafter_dir, tmp_path, fmt, engine, reader):
    model, folder = drafter_dir
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", str(folder), "--format", fmt, "--engine", engine, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert smollm2.info.default_aux_layers == [2, 15, 27]

    reloaded, manifest = load_drafter(out)
    reloaded.load_target_embeddings(embed_weight(smollm2.model).float())  # not exported by default
    aux = torch.randn(1, 6, 3 * 576, generator=torch.Generator().manual_seed(0))  # [1, 6, 3*H]
    ids, pos = torch.randint(0, 49152, (1, 6)), torch.arange(6)[None]
    with torch.no_grad():
        assert torch.equal(reloaded(reloaded.project(aux), ids, pos)[0], model(model.project(aux), ids, pos)[0])
    assert reloaded.config.aux_layer_ids == [2, 15, 27] and manifest["target"]["num_layers"] == 30

    view = reader(out, 30)
    assert view.captured_layers == [2, 15, 27]
    input_ids = torch.tensor([[1, 504, 3456, 28, 253, 1120, 30, 2]])
    with torch.no_grad():
        hs = smollm2.model.model(input_ids=input_ids, output_hidden_states=True).hidden_states  # 31 x [1, 8, 576]
    trained_aux, _ = capture(smollm2.model, input_ids, None, [2, 15, 27])
    assert torch.equal(torch.cat([hs[i] for i in view.captured_layers], dim=-1), trained_aux)
