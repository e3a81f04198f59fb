"""Multi-LoRA serving as SGLang 0.5.23 does it, for a twin that has no weights.

- Startup flags: `--lora-paths` entries are `<PATH>` (the name is the path), `<NAME>=<PATH>` or a
  JSON object `{"lora_name", "lora_path", "pinned"}` (`arg_groups/argparse_actions.py:
  LoRAPathAction`); `--lora-paths` implies `--enable-lora`; the cheap checks of
  `arg_groups/lora_hook.py: check_lora_server_args` and `check_lora_speculative_compatibility`
  (`lora_options`).
- The registry of loaded adapters, name -> LoRARef, in LRU order: each request's lookup moves its
  adapter to the end, and GET /v1/models lists them in that order (`lora/lora_registry.py:
  LoRARegistry`); the backend's own table in load order, which `loaded_adapters` reports
  (`lora/lora_manager.py: create_lora_update_result`); and the ref cache of every adapter ever
  loaded (`managers/tokenizer_manager.py: init_lora`, `lora_ref_cache`).
- Load / unload (`managers/tokenizer_control_mixin.py: load_lora_adapter, unload_lora_adapter`):
  a name already loaded fails, beyond `--max-loaded-loras` the least recently used unpinned adapter
  is unloaded, an unload waits until no request in flight uses the adapter.
- A request's adapter (`managers/tokenizer_manager.py: _validate_and_resolve_lora,
  _resolve_lora_path`): an adapter loaded once and unloaded since is reloaded implicitly, one
  never loaded is a 400; and the OpenAI `model` parameter "served-name:adapter"
  (`entrypoints/openai/serving_base.py: _parse_model_parameter, _resolve_lora_path`).

Assumption: every adapter path loads. The twin reads no `adapter_config.json`, so SGLang's config
errors and its rank / target-module checks against the LoRA memory pool never arise, and
`--max-loras-per-batch` bounds pinned adapters only (the scheduler's per-batch adapter limit is
not modelled).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec

from twin.errors import TokenizerError
from twin.options import LoraAdapter, LoraOptions

__all__ = [
    "LORA_SPEC_ALGORITHMS",
    "Lease",
    "LoRARef",
    "LoraArgError",
    "LoraPath",
    "LoraRegistry",
    "lora_options",
    "parse_lora_paths",
    "parse_model_parameter",
    "resolve_lora_path",
]

# A request's `lora_path` (`managers/io_struct.py: GenerateReqInput.lora_path`)
LoraPath = str | list[str | None] | None

# `arg_groups/lora_hook.py: check_lora_speculative_compatibility` (NGRAM and no speculation pass too)
LORA_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH", "DSPARK")

_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


class LoRARef(msgspec.Struct, frozen=True):
    """`lora/lora_registry.py: LoRARef` (same fields, so error texts that print it match)."""

    lora_id: str
    lora_name: str
    lora_path: str
    pinned: bool = False

    @staticmethod
    def deterministic_id(lora_name: str, lora_path: str) -> str:
        """The stable id of a `--lora-paths` adapter (`LoRARef.deterministic_id`)."""
        return uuid.uuid5(uuid.NAMESPACE_URL, f"{lora_name}\0{lora_path}").hex


class LoraArgError(ValueError):
    """A LoRA flag SGLang would refuse at startup (the CLI prints it on one line, exit 2)."""


# ----------------------------------------------------------------------------- flags


def parse_lora_paths(values: Sequence[str]) -> list[LoraAdapter]:
    """`--lora-paths` entries, as `LoRAPathAction` then `check_lora_server_args` read them."""
    out: list[LoraAdapter] = []
    for raw in values:
        text = raw.strip()
        if text.startswith("{") and text.endswith("}"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:  # SGLang: a traceback; the twin: one line (assumption)
                raise LoraArgError(f"--lora-paths: {text!r} is not valid JSON: {e}") from None
            if not isinstance(obj, dict) or "lora_path" not in obj or "lora_name" not in obj:
                raise LoraArgError(
                    f"{text!r} looks like a JSON str, but it does not contain 'lora_name' and 'lora_path' keys."
                )
            out.append(
                LoraAdapter(name=str(obj["lora_name"]), path=str(obj["lora_path"]), pinned=bool(obj.get("pinned")))
            )
        elif "=" in text:
            name, path = text.split("=", 1)
            out.append(LoraAdapter(name=name, path=path))
        else:
            out.append(LoraAdapter(name=text, path=text))
    return out


def lora_options(
    *,
    enable_lora: bool | None,
    lora_paths: Sequence[str] | None,
    max_loaded_loras: int | None,
    max_loras_per_batch: int,
    max_lora_rank: int | None,
    lora_target_modules: Sequence[str] | None,
    acceptance_scale: float,
    speculative_algorithm: str | None,
) -> LoraOptions:
    """The resolved `lora` namespace, with `check_lora_server_args`'s messages; LoraArgError otherwise."""
    if max_loras_per_batch <= 0:
        raise LoraArgError("max_loras_per_batch must be positive")
    adapters = parse_lora_paths(lora_paths or [])
    enabled = bool(enable_lora) or bool(adapters)  # "--enable-lora is set to True because --lora-paths is provided."
    if not enabled:
        return LoraOptions(max_loaded_loras=max_loaded_loras, max_loras_per_batch=max_loras_per_batch)
    if speculative_algorithm not in (None, "NGRAM", *LORA_SPEC_ALGORITHMS):
        raise LoraArgError(
            "LoRA is only compatible with NGRAM, EAGLE, NEXTN, EAGLE3, DFLASH, or DSPARK speculative decoding, "
            f"not {speculative_algorithm}."
        )
    modules = tuple(dict.fromkeys(lora_target_modules)) if lora_target_modules else None
    if modules and "all" in modules and len(modules) != 1:
        raise LoraArgError("If 'all' is specified in --lora-target-modules, it should be the only module specified.")
    if not adapters and not (max_lora_rank and modules):
        raise LoraArgError(
            "When no initial --lora-paths is provided, you need to specify both --max-lora-rank and "
            "--lora-target-modules for LoRA initialization."
        )
    if max_loaded_loras is not None:
        if max_loaded_loras < max_loras_per_batch:
            raise LoraArgError(
                "max_loaded_loras should be greater than or equal to max_loras_per_batch. "
                f"max_loaded_loras={max_loaded_loras}, max_loras_per_batch={max_loras_per_batch}"
            )
        if len(adapters) > max_loaded_loras:
            raise LoraArgError(
                "The number of LoRA paths should not exceed max_loaded_loras. "
                f"max_loaded_loras={max_loaded_loras}, lora_paths={len(adapters)}"
            )
    names: OrderedDict[str, None] = OrderedDict()
    for a in adapters:  # LoRARegistry.__init__ -> _register_adapter
        if a.name in names:
            raise LoraArgError(f"LoRA with name {a.name} already exists. Loaded LoRAs: {names.keys()}")
        names[a.name] = None
    return LoraOptions(
        enable_lora=True,
        lora_paths=tuple(adapters),
        max_loaded_loras=max_loaded_loras,
        max_loras_per_batch=max_loras_per_batch,
        max_lora_rank=max_lora_rank,
        lora_target_modules=modules,
        acceptance_scale=acceptance_scale,
    )


# --------------------------------------------------------------------- model parameter


def parse_model_parameter(model: str, served_model_name: str) -> tuple[str, str | None]:
    """'base-model:adapter-name' -> (base, adapter); an exact served name (colons included) has no
    adapter (`serving_base.py: _parse_model_parameter`). The base is not checked against the served name."""
    if ":" not in model or model == served_model_name:
        return model, None
    if model.startswith(f"{served_model_name}:"):
        base, adapter = served_model_name, model[len(served_model_name) + 1 :]
    else:
        base, adapter = model.split(":", 1)
    return base.strip(), adapter.strip() or None


def resolve_lora_path(model: str, served_model_name: str, explicit: LoraPath) -> LoraPath:
    """The adapter of the `model` parameter, else the body's `lora_path` (`serving_base.py: _resolve_lora_path`)."""
    _, adapter = parse_model_parameter(model, served_model_name)
    return adapter if adapter is not None else explicit


# ----------------------------------------------------------------------------- registry


class _InFlight:
    """`ConcurrentCounter` of one adapter id: requests using it; `idle` set at zero."""

    __slots__ = ("count", "idle")

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()


class Lease:
    """The adapters one request acquired; released once when it ends."""

    __slots__ = ("ids", "adapter", "released")

    def __init__(self, ids: list[str | None], adapter: str | None) -> None:
        self.ids = ids
        self.adapter = adapter  # the first adapter named (None: base model only)
        self.released = False


def _update_output(success: bool, error_message: str | None, loaded: dict[str, str] | None) -> dict[str, Any]:
    """`LoRAUpdateOutput` as `msgspec_to_builtins` dumps it (`managers/io_struct.py`): BaseReq's
    `rid` and `http_worker_ipc` first, both null on a single-tokenizer server."""
    return {
        "rid": None,
        "http_worker_ipc": None,
        "success": success,
        "error_message": error_message,
        "loaded_adapters": loaded,
    }


class LoraRegistry:
    """Loaded adapters, the ref cache and in-flight counts of one twin server."""

    def __init__(self, options: LoraOptions) -> None:
        self.options = options
        self.enabled = options.enable_lora
        self._registry: OrderedDict[str, LoRARef] = OrderedDict()  # LRU order, most recent last
        self._backend: dict[str, LoRARef] = {}  # lora_id -> ref in load order (LoRAManager.lora_refs)
        self._ref_cache: dict[str, LoRARef] = {}  # name -> latest ref of every adapter ever loaded
        self._in_flight: dict[str, _InFlight] = {}
        self._update_lock = asyncio.Lock()  # TokenizerManager.lora_update_lock
        for a in options.lora_paths:
            ref = LoRARef(LoRARef.deterministic_id(a.name, a.path), a.name, a.path, a.pinned)
            self._register(ref)
            self._backend[ref.lora_id] = ref
            self._ref_cache[ref.lora_name] = ref

    def adapters(self) -> list[LoRARef]:
        """Registered adapters in LRU order (`LoRARegistry.get_all_adapters`)."""
        return list(self._registry.values())

    # ---------------------------------------------------------------- load / unload

    async def load(self, name: str, path: str, pinned: bool = False) -> dict[str, Any]:
        """`load_lora_adapter`: the `LoRAUpdateOutput` body (HTTP 200 if `success`, else 400)."""
        try:
            if not self.enabled:
                raise ValueError(_NOT_ENABLED)
            async with self._update_lock:
                ref = LoRARef(uuid.uuid4().hex, name, path, pinned)
                result = self._backend_load(ref)
                if result["success"]:
                    self._register(ref)
                    self._ref_cache[name] = ref
                limit = self.options.max_loaded_loras
                if limit is not None:
                    while len(self._registry) > limit:
                        lru = self._lru_name(exclude_pinned=True)
                        if lru is None:
                            raise ValueError(
                                "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter. "
                                f"LoRA registry is: {self._registry}"
                            )
                        await self._unload_locked(lru)
                        del result["loaded_adapters"][lru]
                return result
        except ValueError as e:
            return _update_output(False, str(e), None)

    async def unload(self, name: str) -> dict[str, Any]:
        """`unload_lora_adapter`: the `LoRAUpdateOutput` body (HTTP 200 if `success`, else 400)."""
        try:
            if not self.enabled:
                raise ValueError(_NOT_ENABLED)
            async with self._update_lock:
                return await self._unload_locked(name)
        except ValueError as e:
            return _update_output(False, str(e), None)

    def _loaded_adapters(self) -> dict[str, str]:
        return {r.lora_name: r.lora_path for r in self._backend.values()}

    def _backend_load(self, ref: LoRARef) -> dict[str, Any]:
        """`LoRAManager._load_lora_adapter` / `validate_new_adapter`, minus the weights."""
        for existing in self._backend.values():
            if existing.lora_name == ref.lora_name:
                msg = f"Failed to load LoRA adapter {ref.lora_name} because it is already loaded"
                return _update_output(False, msg, self._loaded_adapters())
        pinned = sum(r.pinned for r in self._backend.values())
        if ref.pinned and pinned >= self.options.max_loras_per_batch - 1:
            msg = (
                f"Failed to load LoRA adapter {ref.lora_name} as a pinned adapter. It is not allowed to pin all slots "
                "in the LoRA memory pool to avoid starvation for unpinned adapters and base models. Please increase "
                "your `--max-loras-per-batch` or load it as unpinned LoRA adapters."
            )
            return _update_output(False, msg, self._loaded_adapters())
        self._backend[ref.lora_id] = ref
        return _update_output(True, "", self._loaded_adapters())

    async def _unload_locked(self, name: str) -> dict[str, Any]:
        """`_unload_lora_adapter_locked`: unregister (new requests cannot use it), wait for the ones
        in flight (`LoRARegistry.wait_for_unload`), then unload from the backend."""
        ref = self._registry.get(name)
        if ref is None:
            raise ValueError(f"LoRA with name {name} does not exist. Loaded LoRAs: {self._registry.keys()}")
        del self._registry[name]
        counter = self._in_flight.get(ref.lora_id)
        if counter is not None:
            await counter.idle.wait()
            del self._in_flight[ref.lora_id]
        self._backend.pop(ref.lora_id, None)
        return _update_output(True, "", self._loaded_adapters())

    def _register(self, ref: LoRARef) -> None:
        if ref.lora_name in self._registry:
            raise ValueError(f"LoRA with name {ref.lora_name} already exists. Loaded LoRAs: {self._registry.keys()}")
        self._registry[ref.lora_name] = ref
        self._in_flight[ref.lora_id] = _InFlight()

    def _lru_name(self, exclude_pinned: bool) -> str | None:
        for name, ref in self._registry.items():
            if not (exclude_pinned and ref.pinned):
                return name
        return None

    # --------------------------------------------------------------------- requests

    async def acquire(self, lora_path: LoraPath) -> Lease | None:
        """Resolve a request's adapter(s) and count it in flight; None without one. Raises
        TokenizerError with SGLang's text (`_validate_and_resolve_lora`, `_resolve_lora_path`)."""
        if not lora_path:
            return None
        if not self.enabled:
            first = lora_path if isinstance(lora_path, str) else next((a for a in lora_path if a), None)
            raise TokenizerError(
                f"LoRA adapter '{first}' was requested, but LoRA is not enabled. "
                "Please launch the server with --enable-lora flag and preload adapters "
                "using --lora-paths or /load_lora_adapter endpoint."
            )
        names: list[str | None] = [lora_path] if isinstance(lora_path, str) else list(lora_path)
        unique = set(names)
        limit = self.options.max_loaded_loras
        if limit is not None and len(unique) > limit:
            raise TokenizerError(
                f"Received request with {len(unique)} unique loras requested but max loaded loras is {limit}"
            )
        unregistered: list[str | None] = []
        for name in unique:  # LoRARegistry.get_unregistered_loras: a lookup counts as a use
            if name is not None and name in self._registry:
                self._registry.move_to_end(name)
            else:
                unregistered.append(name)
        for name in unregistered:
            if name is None:
                continue
            if name not in self._ref_cache:
                raise TokenizerError(
                    f"Got LoRA adapter that has never been loaded: {name}\n"
                    f"All loaded adapters: {self._ref_cache.keys()}."
                )
            ref = self._ref_cache[name]  # "Reloading evicted adapter"
            result = await self.load(ref.lora_name, ref.lora_path, ref.pinned)
            message = result["error_message"] or ""
            if not result["success"] and "already loaded" not in message:
                raise TokenizerError(f"Failed to implicitly load LoRA adapter {name}: {message}")
        ids = [self._lookup(name) for name in names]  # LoRARegistry.acquire
        for lora_id in ids:
            if lora_id is not None:
                counter = self._in_flight[lora_id]
                counter.count += 1
                counter.idle.clear()
        return Lease(ids, next((n for n in names if n), None))

    def _lookup(self, name: str | None) -> str | None:
        if name is None:
            return None
        ref = self._registry.get(name)
        if ref is None:
            raise TokenizerError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {self._registry.keys()}."
            )
        self._registry.move_to_end(name)
        return ref.lora_id

    def release(self, lease: Lease) -> None:
        """The request ended (`LoRARegistry.release`); idempotent."""
        if lease.released:
            return
        lease.released = True
        for lora_id in lease.ids:
            counter = self._in_flight.get(lora_id) if lora_id is not None else None
            if counter is not None:
                counter.count -= 1
                if counter.count <= 0:
                    counter.count = 0
                    counter.idle.set()
