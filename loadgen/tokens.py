"""Counting prompt tokens the way the target will, from the best source at hand.

* `RemoteCounter`: the target's own `/tokenize` (vLLM, the toposerve proxy): exact.
* `LocalCounter`: a Hugging Face tokenizer given with `--tokenizer PATH_OR_HUB_ID`: exact when it
  is the served model's tokenizer; loaded with transformers' AutoTokenizer, which resolves a hub
  id through huggingface_hub. A local directory whose tokenizer_config.json names transformers'
  generic tokenizers class is loaded with that class directly: the one AutoTokenizer would pick
  (see `_generic_class`), without AutoTokenizer's import of torch (over 5 s of every start).
  A hub id takes the same way: its tokenizer files are fetched into the hub cache by
  huggingface_hub (`_fetched`), and the snapshot folder is that local directory; AutoTokenizer
  loads the id itself only where that folder is not the generic class's, or where the fetch
  failed in a way loadgen does not word (see `_fetched`).
  As `topocommon.hub` does, HF_HOME / HF_HUB_CACHE,
  HF_TOKEN and HF_HUB_OFFLINE are read when the tokenizer is loaded (huggingface_hub reads them
  once, at its import); HF_ENDPOINT is still read at that import, which for the CLI is its start.
  Chat prompts are counted through the tokenizer's chat template (`add_generation_prompt`).
* `UsageCounter`: neither: each count is a 1-token request whose `usage.prompt_tokens` is read
  back (calibration). Counts are cached per input, and the request count is reported.

Every counter answers `text(prompt)` (a /v1/completions prompt, special tokens as the server
adds them) and `chat(messages)` (the templated conversation).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from loadgen.errors import NoTokenize, TargetError, TokenizerError
from loadgen.target import is_count
from topocommon import jsontext
from topocommon.hub import HubEnv, is_repo_id

Messages = Sequence[Mapping[str, Any]]


class Counter(Protocol):
    source: str  # "tokenize", "tokenizer" or "usage": where counts come from
    exact: bool  # counts are the server's own (False: a calibration whose shuffles may drift)

    def text(self, prompt: str) -> int: ...

    def chat(self, messages: Messages) -> int: ...


class RemoteCounter:
    source = "tokenize"
    exact = True

    def __init__(self, tokenize: Callable[..., dict[str, Any]], model: str) -> None:
        self._tokenize = tokenize
        self._model = model

    def text(self, prompt: str) -> int:
        return _count(self._tokenize(self._model, prompt=prompt))

    def chat(self, messages: Messages) -> int:
        try:
            body = self._tokenize(
                self._model, messages=list(messages), add_generation_prompt=True
            )
        except NoTokenize as exc:
            # Its /tokenize counted text a moment ago: a refusal of messages is the server's
            # chat template (vLLM: none set), and its own words say so.
            raise TargetError(
                f"the server cannot render a chat prompt ({exc.refusal or exc}): serve the"
                " model with a chat template (vLLM: --chat-template FILE)"
            ) from None
        return _count(body)


def _count(body: Mapping[str, Any]) -> int:
    count = body.get("count")
    # a count the server gets wrong in type or sign: its token list says (tokenize checked it)
    if is_count(count):
        return count
    return len(body["tokens"])


class LocalCounter:
    source = "tokenizer"
    exact = True

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tok = tokenizer
        self.name = name

    def text(self, prompt: str) -> int:
        # What an OpenAI-compatible server does with a text prompt: special tokens added.
        return len(self._tok(prompt)["input_ids"])

    def output(self, text: str) -> int:
        """Tokens of generated text (no special tokens: the server did not send any)."""
        return len(self._tok(text, add_special_tokens=False)["input_ids"]) if text else 0

    def chat(self, messages: Messages) -> int:
        try:
            ids = self._tok.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=True
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise TokenizerError(
                f"tokenizer {self.name!r} cannot render a chat prompt ({_first_line(exc)}):"
                " give a tokenizer with a chat template, or drop --chat"
            ) from None
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)


def load_tokenizer(name: str) -> LocalCounter:
    """AutoTokenizer.from_pretrained(name) -> LocalCounter; TokenizerError in one line."""
    if not Path(name).exists() and not is_repo_id(name):  # said before transformers' slow import
        raise TokenizerError(f"cannot load tokenizer {name!r} (no such directory): {_GIVE}")
    try:
        import transformers
    except ImportError:
        raise TokenizerError(
            "--tokenizer needs the transformers package: pip install transformers"
        ) from None
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # its advice on stderr is not loadgen's output
    try:
        folder = Path(name) if Path(name).exists() else _fetched(name)
        if folder is not None and _generic_class(folder):
            from transformers.tokenization_utils_tokenizers import TokenizersBackend

            tok = TokenizersBackend.from_pretrained(str(folder))
        else:
            tok = _from_pretrained(transformers.AutoTokenizer, name)
    except Exception as exc:  # OSError, ValueError, hub errors: all mean "not loadable"
        raise TokenizerError(
            f"cannot load tokenizer {name!r} ({_first_line(exc)}): {_GIVE}"
        ) from None
    if not callable(tok):
        raise TokenizerError(f"{name!r} did not load as a tokenizer: give a tokenizer directory")
    return LocalCounter(tok, name)


_GIVE = ("give a directory holding tokenizer.json (or tokenizer_config.json), or a hub id"
         " reachable through HF_ENDPOINT with HF_HUB_OFFLINE unset")
GENERIC_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def _generic_class(folder: Path) -> bool:
    """True when AutoTokenizer would load ``folder`` with transformers' generic TokenizersBackend
    (PreTrainedTokenizerFast is its alias): its tokenizer_config.json names that class, with no
    remote code, no Mistral-format files, and no model type whose hub configs transformers
    distrusts (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, for which it picks the model type's
    own class). Anything unreadable or unknown: False, and AutoTokenizer decides."""
    try:
        tok_cfg = jsontext.loads((folder / "tokenizer_config.json").read_text())
        model_cfg = (jsontext.loads((folder / "config.json").read_text())
                     if (folder / "config.json").is_file() else {})
    except (OSError, ValueError):
        return False
    if not (isinstance(tok_cfg, dict) and isinstance(model_cfg, dict)):
        return False
    named = tok_cfg.get("tokenizer_class")
    # isinstance first: a list there is unhashable (a TypeError in the set lookup), no class
    if (not isinstance(named, str) or named not in GENERIC_CLASSES or "auto_map" in tok_cfg
            or "auto_map" in model_cfg or not (folder / "tokenizer.json").is_file()
            or (folder / "tekken.json").exists()):
        return False
    model_type = model_cfg.get("model_type")
    if model_type is None:
        return True
    distrusted = _distrusted_model_types()
    return distrusted is not None and isinstance(model_type, str) and model_type not in distrusted


def _distrusted_model_types() -> frozenset[str] | None:
    """transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, read from its source: importing
    the module that holds it imports torch, which is the cost avoided. None when not found."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "models" / "auto" / "tokenization_auto.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    target: ast.expr
    value: ast.expr | None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == _DISTRUSTED and value is not None:
            try:
                names = ast.literal_eval(value)
            except ValueError:
                return None
            if isinstance(names, set) and all(isinstance(n, str) for n in names):
                return frozenset(names)
            return None
    return None


_DISTRUSTED = "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS"


# What a tokenizer folder may hold that the generic class reads (tokenizer*.json: tokenizer.json,
# its config and the versioned fast_tokenizer_files), what `_generic_class` reads (config.json),
# and the Mistral file whose presence sends the folder to AutoTokenizer (tekken.json): never the
# weights.
TOKENIZER_FILES = (
    "tokenizer*.json", "config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "additional_chat_templates/*.jinja",
    "tekken.json",
)


def _fetched(name: str) -> Path | None:
    """The hub cache's snapshot folder of hub id ``name`` holding its tokenizer files, fetched
    (or, offline, found) with the cache, token and offline mode AutoTokenizer is given
    (`_from_pretrained`). A missing repository, a gated one, or an id neither reachable nor cached
    raises OSError with AutoTokenizer's own first line for it; None where ``name`` is no hub id or
    the fetch failed otherwise (a revision, a server error, an incomplete cached snapshot):
    AutoTokenizer then tries and words it, as before."""
    if not is_repo_id(name):
        return None
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils.tqdm import tqdm as hub_tqdm

    class Quiet(hub_tqdm):  # type: ignore[misc]
        # Its "Fetching N files" bar is written to stderr even off a terminal: a few small
        # files are no progress to show, and an error must stay loadgen's one line.
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})  # type: ignore[no-untyped-call]

    hub = HubEnv.from_env(os.environ)
    try:
        with _offline(hub.offline):
            return Path(snapshot_download(
                name, allow_patterns=list(TOKENIZER_FILES), cache_dir=str(hub.cache),
                token=hub.token, local_files_only=hub.offline, tqdm_class=Quiet,
            ))
    except GatedRepoError:  # a RepositoryNotFoundError too: first
        raise OSError("You are trying to access a gated repo.") from None
    except RepositoryNotFoundError:
        raise OSError(f"{name} is not a local folder and is not a valid model identifier listed"
                      " on 'https://huggingface.co/models'") from None
    except LocalEntryNotFoundError as exc:
        # The hub answered with an error of its own, or the cache holds the snapshot without all
        # of the files listed for it (AutoTokenizer may need fewer): AutoTokenizer's to say.
        if isinstance(exc, IncompleteSnapshotError) or isinstance(exc.__cause__, HfHubHTTPError):
            return None
        raise OSError(f"We couldn't connect to '{constants.ENDPOINT}' to load the files, and"
                      " couldn't find them in the cached files.") from None
    except Exception:  # AutoTokenizer's own try says what it is
        return None


@contextmanager
def _offline(offline: bool) -> Iterator[None]:
    """huggingface_hub's offline switch as the environment says now, not as it said at the
    hub's import; put back after."""
    from huggingface_hub import constants

    was_offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = offline
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = was_offline


def _from_pretrained(auto: Any, name: str) -> Any:
    """auto.from_pretrained(name), a hub id with the environment as it is now, not as it was
    when huggingface_hub was imported: the reading the planner shares (topocommon.hub.HubEnv)."""
    if Path(name).exists() or not is_repo_id(name):
        return auto.from_pretrained(name)
    hub = HubEnv.from_env(os.environ)
    with _offline(hub.offline):
        return auto.from_pretrained(
            name, cache_dir=str(hub.cache), token=hub.token, local_files_only=hub.offline
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


Post = Callable[[str, dict[str, Any]], Any]  # (path, JSON body) -> parsed JSON answer


class UsageCounter:
    """Counts by asking the server: one non-streamed, 1-token request per distinct input."""

    source = "usage"
    exact = False

    def __init__(self, post: Post, model: str) -> None:
        self._post = post
        self._model = model
        self._cache: dict[str, int] = {}
        self.requests = 0

    def text(self, prompt: str) -> int:
        if not prompt:  # some servers refuse an empty prompt: a one-token word, less one
            return max(0, self._ask("/v1/completions", {"prompt": "a"}) - 1)
        return self._ask("/v1/completions", {"prompt": prompt})

    def chat(self, messages: Messages) -> int:
        return self._ask("/v1/chat/completions", {"messages": list(messages)})

    def _ask(self, path: str, fields: dict[str, Any]) -> int:
        key = path + json.dumps(fields, sort_keys=True)
        if key in self._cache:
            return self._cache[key]
        body = {"model": self._model, "max_tokens": 1, "temperature": 0.0, **fields}
        self.requests += 1
        answer = self._post(path, body)
        count = prompt_tokens_of(answer)
        if count is None:
            raise TargetError(
                f"{path} answered without usage.prompt_tokens, so loadgen cannot calibrate"
                " prompts: pass --tokenizer with the served model's tokenizer"
            )
        self._cache[key] = count
        return count


def prompt_tokens_of(answer: Any) -> int | None:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
