"""Every route of the app vLLM's API server builds for the given engine args, as JSON (run by vLLM's interpreter).

    $(python -m eksflow.llm.engines where vllm) tests/e2e/vllm_app_routes.py '["generate"]' --model=... --enable-lora

The same `build_app` the server calls after the engine reports its supported tasks, with the same args and
environment (middleware, LoRA routes), but no engine: the routes that /openapi.json leaves out (/docs, /redoc,
the /metrics mount, include_in_schema=False ones) are listed too. Prints [[method, path], ...]; a Mount, which
answers any method, is listed with GET and POST.
"""

import json
import sys

from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main() -> None:
    """Build the app and print its routes."""
    tasks = tuple(json.loads(sys.argv[1]))
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[2:])
    app = build_app(args, tasks, None)
    routes = set()
    for route in app.routes:
        methods = getattr(route, "methods", None) or ("GET", "POST")
        routes |= {(method, str(route.path)) for method in methods}  # type: ignore[attr-defined]
    print(json.dumps(sorted(routes)))


if __name__ == "__main__":
    main()
