"""``sarathi serve``: the OpenAI-compatible HTTP server (API process) over an engine-core process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time

from sarathi.entrypoints.args import add_config_args, add_engine_args, config_args, engine_config_from_args
from sarathi.entrypoints.openai.guards import AccessPolicy, RequestLimits
from sarathi.entrypoints.openai.tool_calls import TOOL_CALL_PARSERS, choose_tool_parser
from sarathi.structured_output import StructuredOutputLimits

DEFAULT_PORT = 8000


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    p.add_argument("model_tag", nargs="?", default=None, help="same as --model")
    http = p.add_argument_group("HTTP")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=DEFAULT_PORT)
    http.add_argument("--served-model-name", default=None, help="model name clients use (default: derived)")
    http.add_argument(
        "--max-waiting", type=int, default=1024, help="waiting-queue bound; beyond it requests get HTTP 429"
    )
    http.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get on SIGINT/SIGTERM",
    )
    http.add_argument(
        "--restart-engine-on-failure",
        action="store_true",
        help="start a new engine core when it dies (in-flight requests still fail; /health is 503 meanwhile)",
    )
    http.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    guard = p.add_argument_group("limits and access")
    guard.add_argument(
        "--api-key",
        default=os.environ.get("SARATHI_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* (default: $SARATHI_API_KEY, else none)",
    )
    guard.add_argument(
        "--allowed-origins", default="", help="comma-separated origins browsers may call from (CORS)"
    )
    guard.add_argument(
        "--allowed-hosts", default=None, help="comma-separated Host header names accepted (default: any)"
    )
    add_config_args(guard, RequestLimits)
    so = p.add_argument_group("structured outputs (bounds checked before compiling; over one: HTTP 400)")
    add_config_args(so, StructuredOutputLimits)
    tools = p.add_argument_group("tool calling")
    tools.add_argument(
        "--tool-call-parser",
        choices=list(TOOL_CALL_PARSERS),
        default=None,
        help="how tool calls are read from free output for tool_choice 'auto' (default: chosen from the "
        "model's chat template, printed at start-up)",
    )
    tools.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tool_choice 'auto' (the default with tools); --no-enable-auto-tool-choice refuses it. "
        "'required' and named functions always work",
    )
    add_engine_args(p)
    # The token budget for the paper's strict TBT SLO on this machine, printed with its reason.
    p.set_defaults(run=run, token_budget="auto")
    return p


def served_model_name(model: str | None, explicit: str | None) -> str:
    if explicit:
        return explicit
    if model is None:
        return "SmolLM2-135M-Instruct"
    return os.path.basename(os.path.normpath(model)).removesuffix(".gguf")


def run(args: argparse.Namespace) -> int:
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            print("error: give the model either as an argument or with --model, not both", file=sys.stderr)
            return 2
        args.model = args.model_tag
    try:
        config = engine_config_from_args(args)
        limits = RequestLimits(**config_args(args, RequestLimits))
        constraint_limits = StructuredOutputLimits(**config_args(args, StructuredOutputLimits))
        policy = AccessPolicy(
            api_key=args.api_key or None,
            allowed_origins=_csv(args.allowed_origins),
            allowed_hosts=None if args.allowed_hosts is None else _csv(args.allowed_hosts.lower()),
        )
        if args.max_waiting < 1:
            raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(args, config, limits, constraint_limits, policy))
    except RuntimeError as e:  # the engine core could not start
        print(f"error: {e}", file=sys.stderr)
        return 1


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


async def _serve(
    args: argparse.Namespace,
    config,
    limits: RequestLimits,
    constraint_limits: StructuredOutputLimits,
    policy: AccessPolicy,
) -> int:
    import uvicorn

    from sarathi.core.schedulers import SCHEDULERS
    from sarathi.engine.core_client import EngineCoreClient
    from sarathi.entrypoints.build import build_engine
    from sarathi.entrypoints.openai.api_server import ServerState, create_app
    from sarathi.entrypoints.openai.constraint_checker import ConstraintChecker
    from sarathi.entrypoints.openai.server_metrics import ServerMetrics
    from sarathi.net import bind_listener
    from sarathi.tokenizer import Tokenizer

    try:  # the port first: the engine core and workers open sockets of their own while they start
        listener = bind_listener(args.host, args.port)
    except OSError as e:
        raise RuntimeError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    port = listener.getsockname()[1]
    name = served_model_name(config.model.model, args.served_model_name)
    print(f"sarathi serve: loading {name} ...", flush=True)
    client = EngineCoreClient(config, build_engine, args.max_waiting, args.restart_engine_on_failure)
    # This process's tokenizer library loads while the engine core starts (the folder comes with it).
    preload = threading.Thread(target=Tokenizer.preload, name="sarathi-tokenizer-import", daemon=True)
    preload.start()
    try:
        ready = await client.start()
        await asyncio.to_thread(preload.join)
        tokenizer = Tokenizer(ready.tokenizer_dir) if ready.tokenizer_dir else None
        sched = ready.config.scheduler
        budget = sched.token_budget if SCHEDULERS[sched.name].chunked_prefills else None
        metrics = ServerMetrics(name, budget)
        state = ServerState(client, name, tokenizer, metrics, int(time.time()), limits)
        state.constraint_limits = constraint_limits
        if ready.tokenizer_dir is not None:
            state.constraints = ConstraintChecker(
                ready.tokenizer_dir, ready.vocab_size, ready.eos_token_ids, constraint_limits
            )
        parser, why = choose_tool_parser(tokenizer.chat_template if tokenizer else None)
        if args.tool_call_parser is not None:
            parser, why = args.tool_call_parser, "--tool-call-parser"
        state.tool_call_parser = parser
        state.enable_auto_tool_choice = args.enable_auto_tool_choice
        if args.enable_auto_tool_choice:
            print(f"sarathi serve: tool_choice 'auto' on, tool call parser {parser} ({why})", flush=True)
        else:
            print("sarathi serve: tool_choice 'auto' off (--no-enable-auto-tool-choice)", flush=True)
        app = create_app(state, policy)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=args.host,
                port=port,
                log_level=args.log_level,
                timeout_graceful_shutdown=args.shutdown_timeout,
                access_log=args.log_level == "debug",
            )
        )
        effective = state.effective_config(policy.api_key is not None)
        print(f"sarathi serve: effective config {json.dumps(effective, default=str)}", flush=True)
        print(f"sarathi serve: listening on http://{args.host}:{port}", flush=True)
        await server.serve(sockets=[listener])
    finally:
        listener.close()
        with contextlib.suppress(Exception):
            await client.shutdown()
    return 0
