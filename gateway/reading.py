"""Reading a generation request: its body parsed (gateway.openai_request), its model resolved (and a
pinned backend, a LoRA adapter), its policy picked, its routing features computed. The result is a
`Request` (gateway.request); anything wrong with it is an `ApiError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.adapters import split_model
from gateway.config import Config
from gateway.errors import ApiError, clip, model_not_found
from gateway.extras import check_extras
from gateway.openai_request import ParsedRequest
from gateway.pool import Pools
from gateway.principal import Principal
from gateway.request import BACKEND_HEADER, Request
from gateway.response_holders import ResponseLookups
from gateway.response_owners import ResponseOwners
from gateway.tracing import Trace
from gateway.via import forwarded_via
from policies import POLICY_NAMES, Policy, RequestFeatures, classify, make_policy
from policies.copy import conversation_keys
from policies.prefix import namespace, text_blocks, token_blocks
from policies.simple import Pinned

__all__ = ["CHARS_PER_TOKEN", "POLICY_HEADER", "RequestReader", "prefix_keys"]

POLICY_HEADER = "x-specroute-policy"
CHARS_PER_TOKEN = 4  # the gateway does not tokenize: its prompt-size estimate
ANONYMOUS = Principal("anonymous", None)  # a request no door let in (tests that drive the proxy directly)


class RequestReader:
    def __init__(
        self,
        pools: Pools,
        policies: Mapping[str, Policy],
        owners: ResponseOwners,
        lookups: ResponseLookups,
        config: Config,
    ) -> None:
        self.pools = pools
        self.policies = policies  # shared with the runtime: a reload swaps policies in place
        self.owners = owners
        self.lookups = lookups
        self.configure(config)

    def configure(self, config: Config) -> None:
        """(Re)read the settings reading uses; called again on reload."""
        self.allow_policy_header = config.gateway.allow_policy_header
        self.allowed_extras = frozenset(config.gateway.allowed_extras)
        self.default_priority = config.admission.default_priority
        self._config = config
        self._header_policies: dict[tuple[str, str], Policy] = {}

    def all_policies(self) -> list[Policy]:
        """Every policy instance that routes: the models' own and those clients chose by header."""
        return [*self.policies.values(), *self._header_policies.values()]

    async def read(
        self,
        parsed: ParsedRequest,
        raw: bytes,
        headers: Mapping[str, str],
        request_id: str,
        trace: Trace | None,
        t_received: float,
        principal: Principal | None,
    ) -> Request:
        """The request `parsed` (from `raw`, gateway.openai_request.parse) as the proxy runs it."""
        kind = parsed.kind
        check_extras(parsed.body.client_fields(), self.allowed_extras)
        if parsed.priority is not None:
            self._clamp_priority(parsed, principal or ANONYMOUS)
        model, pin, adapter = self._resolve_target(parsed.model, headers.get(BACKEND_HEADER))
        if kind == "responses":
            chosen = parsed.request_id
            if chosen is not None and chosen in self.owners:
                raise ApiError(
                    409,
                    f"a Response with id {chosen!r} exists already; a new one cannot take its id",
                    param="request_id",
                    code="response_exists",
                )
            if pin is None:
                pin = await self._holder_of_previous(parsed, model, headers)
        if adapter is not None:
            self._check_adapters(model, pin, frozenset((adapter,)), "model")
        elif parsed.lora_paths:
            self._check_adapters(model, pin, parsed.lora_paths, "lora_path")
        policy = self._policy_for(model, pin, headers.get(POLICY_HEADER))
        prefix, prompt_key, copy_of = prefix_keys(parsed, adapter)
        features = RequestFeatures(
            model=model,
            domain=classify(parsed.prompt_text),
            prompt_tokens=len(parsed.prompt_text) // CHARS_PER_TOKEN + parsed.id_tokens,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            temperature=parsed.temperature,
            thinking=parsed.thinking,
            tools=parsed.tools,
            sequences=parsed.sequences,
            prefix=prefix,
            prompt_key=prompt_key,
            copy_of=copy_of,
        )
        parsed.history = None  # read into the prefix chain: its objects are not kept
        return Request(kind, headers, request_id, trace, t_received, parsed, raw, model, pin, features, policy, adapter)

    def _clamp_priority(self, parsed: ParsedRequest, principal: Principal) -> None:
        """A client's `priority` into the range its key may set (gateway.principal), upstream too:
        without one, any client could push other tenants' waiting requests out of the queue."""
        asked = parsed.priority
        assert asked is not None
        allowed = principal.clamp_priority(asked, self.default_priority)
        if allowed != asked:
            parsed.priority = allowed
            parsed.body["priority"] = allowed

    def _resolve_target(self, model: str, pin_header: str | None) -> tuple[str, str | None, str | None]:
        """(model, pinned backend, LoRA adapter). `kimi-k2.6@k26-eagle3` or header
        `x-specroute-backend` pins a backend of that model's pool; `kimi-k2.6:adapter` names an
        adapter, as SGLang's `model` does."""
        pin = pin_header or None
        by_model = self.pools.by_model
        if model not in by_model and "@" in model:
            model, _, named = model.rpartition("@")
            if pin is not None and named != pin:
                raise ApiError(
                    400,
                    f"the model pins backend {clip(named)} and the {BACKEND_HEADER} header {clip(pin)}: name one",
                    param="model",
                )
            pin = named
        adapter = None
        if model not in by_model:
            model, adapter = split_model(model, by_model)
        if model not in by_model:
            raise model_not_found(model, self.pools.models())
        if pin is not None:
            backend = self.pools.by_name.get(pin)
            if backend is None or backend.spec.model != model:
                raise ApiError(
                    404,
                    f"backend {clip(pin)} does not serve model {clip(model)}",
                    param="model",
                    code="backend_not_found",
                )
        return model, pin, adapter

    async def _holder_of_previous(self, parsed: ParsedRequest, model: str, headers: Mapping[str, str]) -> str | None:
        """The backend holding `previous_response_id`'s stored Response (its id's shape checked by
        `parse`): the follow-up can be answered only there. One this gateway has no record of
        (relayed by another replica, or before a restart) is looked for among the backends of the
        request's own model (gateway.response_holders), once the model is known. None when no
        backend has it (never stored, or lost with its server's restart): the backend that gets it
        answers that it does not know it."""
        previous = parsed.previous_response_id
        if previous is None:
            return None
        members = self.pools.by_model[model]
        holder = self.owners.owner(previous)
        if holder is None:
            found = await self.lookups.find(previous, members, via=forwarded_via(headers.get("via")))
            holder = found[0].name if found is not None else None
        return holder if any(b.name == holder for b in members) else None

    def _check_adapters(self, model: str, pin: str | None, adapters: frozenset[str], param: str) -> None:
        """404 for adapters no backend of the model (or the pinned one) has loaded: no wait can help."""
        backends = [b for b in self.pools.by_model[model] if pin is None or b.name == pin]
        if any(adapters <= b.adapters for b in backends):
            return
        loaded: frozenset[str] = frozenset().union(*(b.adapters for b in backends))
        where = f"backend {pin!r}" if pin else f"any backend of model {model!r}"
        missing = sorted(adapters - loaded)
        if missing:
            message = f"LoRA adapter {', '.join(map(clip, missing[:8]))} is not loaded on {where}"
        else:  # each is loaded somewhere, no backend has them all
            named = ", ".join(map(clip, sorted(adapters)[:8]))
            message = f"no single backend of model {model!r} has LoRA adapters [{named}] loaded together"
        raise ApiError(404, f"{message}; loaded: {sorted(loaded)}", param=param, code="model_not_found")

    def _policy_for(self, model: str, pin: str | None, requested: str | None) -> Policy:
        if pin:
            return Pinned(pin)
        if requested and requested != self.policies[model].name:
            if not self.allow_policy_header:
                raise ApiError(
                    403,
                    "choosing a policy per request (x-specroute-policy) is not enabled on this "
                    "gateway (gateway.allow_policy_header)",
                    param=POLICY_HEADER,
                )
            key = (model, requested)
            policy = self._header_policies.get(key)
            if policy is None:  # one instance per (model, policy): it keeps learning across requests
                if requested not in POLICY_NAMES or requested == "pinned":
                    raise ApiError(
                        400,
                        f"unknown policy {clip(requested)} in {POLICY_HEADER}; expected one of "
                        f"{[p for p in POLICY_NAMES if p != 'pinned']}",
                        param=POLICY_HEADER,
                    )
                policy = make_policy(requested, **self._config.policy_options(model, requested))
                self._header_policies[key] = policy
            return policy
        return self.policies[model]


def prefix_keys(parsed: ParsedRequest, adapter: str | None) -> tuple[tuple[int, ...], int, int]:
    """The request's hash chain of prefix blocks (policies.prefix), in SGLang's radix cache
    namespace: a prefix cached under another adapter, extra_key or cache_salt is no hit; and for
    a message history its answer key and the key of the request whose answer a copy-heavy turn
    asks back (policies.copy; 0: none)."""
    seed = 0
    lora, extra_key, salt = adapter or parsed.lora_path, parsed.extra_key, parsed.cache_salt
    if parsed.kind == "responses":
        lora = None  # SGLang's Responses API checks an adapter but runs the base model (docs/sglang-api.md)
    if lora is not None or extra_key is not None or salt is not None:
        seed = namespace(_hashable(lora), _hashable(extra_key), _hashable(salt))
    if parsed.history is not None:
        return conversation_keys(parsed.history, seed)
    if parsed.prompt_ids is not None:
        return token_blocks(parsed.prompt_ids, seed), 0, 0
    return text_blocks(parsed.prompt_text, seed), 0, 0


def _hashable(value: Any) -> Any:
    """A JSON value as a hash key: lists as tuples (of hashable values, else None: not tracked apart)."""
    if isinstance(value, list):
        return tuple(value) if all(v is None or isinstance(v, (str, int)) for v in value) else None
    return value if value is None or isinstance(value, (str, int)) else None
