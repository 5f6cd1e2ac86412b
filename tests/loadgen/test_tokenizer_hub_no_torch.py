"""`loadgen --tokenizer org/name` takes the local folder's torch-free way: the hub id's tokenizer
files (never its weights) are fetched into the hub cache and that snapshot folder is loaded as a
local directory is, so a fresh process never imports torch (AutoTokenizer's ~8 s); a repository
whose folder AutoTokenizer must handle itself (here a model type whose hub tokenizer class
transformers distrusts) still loads, as AutoTokenizer loads it.

One process of its own does both loads, on a fresh machine (HF_ENDPOINT at a stand-in hub on
loopback, an empty HF_HOME): huggingface_hub reads HF_ENDPOINT once, at its import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from loadgen.tokens import load_tokenizer
from tests.launcher.standin_hub import Repo, StandinHub, commit_of
from tests.loadgen.conftest import REPO

FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
TEXTS = ["", "def f(x):\n    return x + 1\n", " the" * 50]
MESSAGES = [{"role": "user", "content": "Fix the bug in parse_args()."}]

LOADS = """
import json, sys
from loadgen.tokens import load_tokenizer
texts, messages = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def counts(tok):
    return {"text": [tok.text(t) for t in texts], "chat": tok.chat(messages),
            "class": type(tok._tok).__name__}
fast = counts(load_tokenizer("org/name"))
fast["torch"] = "torch" in sys.modules
routed = counts(load_tokenizer("org/qwen2"))
from transformers import AutoTokenizer  # what it picks for the same folder on disk
auto = AutoTokenizer.from_pretrained(sys.argv[3])
picked = {"text": [len(auto(t)["input_ids"]) for t in texts], "class": type(auto).__name__}
print(json.dumps({"fast": fast, "routed": routed, "auto": picked}))
"""


def test_a_hub_id_loads_without_importing_torch_and_autotokenizers_cases_still_load(
    tiny_model_path: str, tmp_path: Path
) -> None:
    qwen2 = tmp_path / "qwen2"  # the same tokenizer in a model type AutoTokenizer handles itself
    shutil.copytree(tiny_model_path, qwen2, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((qwen2 / "config.json").read_text())
    (qwen2 / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2"}))
    main = commit_of("main")
    weights = {"model.safetensors": b"\0" * 4096}  # on the hub beside the tokenizer, not fetched
    hub = StandinHub({
        repo_id: Repo(commits={main: {**{n: (folder / n).read_bytes() for n in FILES},
                                      **weights}}, refs={"main": main})
        for repo_id, folder in (("org/name", Path(tiny_model_path)), ("org/qwen2", qwen2))
    }).start()
    try:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        base.pop("TRANSFORMERS_OFFLINE", None)
        result = subprocess.run(
            [sys.executable, "-c", LOADS, json.dumps(TEXTS), json.dumps(MESSAGES), str(qwen2)],
            capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
            env={**base, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")},
        )
        asked = hub.paths()
    finally:
        hub.stop()
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress bars, no advice
    got = json.loads(result.stdout)
    local = load_tokenizer(tiny_model_path)
    assert got["fast"] == {"text": [local.text(t) for t in TEXTS], "chat": local.chat(MESSAGES),
                           "class": type(local._tok).__name__, "torch": False}
    assert any(p.endswith("/org/name/revision/main") for p in asked)  # fetched, not found
    assert not any(p.endswith(".safetensors") for p in asked)
    assert got["routed"] == {
        **got["auto"],
        "chat": local.chat(MESSAGES),  # the same tokenizer and template, whatever the class
    }
    assert got["routed"]["class"] != got["fast"]["class"]  # AutoTokenizer's pick, not the fast one
