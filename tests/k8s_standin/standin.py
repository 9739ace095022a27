#!/usr/bin/env python3
"""A stand-in for the Kubernetes API server's pod endpoints, for tests: each pod runs as a local
docker container. Standard library only (Python 3.11). docs/kubernetes-standin.md says what it
implements, its fault-injection interface and what it does not model.

    python3 tests/k8s_standin/standin.py --port 0
prints `listening PORT` as its first line, then serves until SIGTERM/SIGINT, when it removes
every container it started."""

import argparse
import json
import os
import secrets
import signal
import sys
import threading
from http.server import ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api_routes import Handler  # noqa: E402
from faults import Faults, parse_flag_drop, parse_flag_fault  # noqa: E402
from pod_store import PodStore  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--instance", default="", help="label value naming this stand-in's containers (default: random)")
    parser.add_argument("--docker-cli", default="docker", help="the docker-compatible CLI (docker, podman)")
    parser.add_argument("--fault", action="append", default=[], metavar="METHOD:PATH_REGEX:STATUS:COUNT",
                        help="answer the next COUNT matching requests with STATUS (409, 429, 500, 503); repeatable")
    parser.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds of --fault 429 answers")
    parser.add_argument("--drop-exec", action="append", default=[], metavar="K[:before_output|after_output]",
                        help="cut the Kth exec websocket's TCP connection; repeatable")
    parser.add_argument("--faults-json", help="a file with a POST /standin/faults body")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    return parser.parse_args(argv)


def load_faults(args):
    faults = Faults()
    try:
        http = [dict(parse_flag_fault(f), retry_after=args.retry_after) for f in args.fault]
        drops = [parse_flag_drop(d) for d in args.drop_exec]
        faults.add({"http": http, "exec_drops": drops}, "flags")
        if args.faults_json:
            with open(args.faults_json) as f:
                faults.add(json.load(f), args.faults_json)
    except (ValueError, OSError) as e:
        sys.exit(f"k8s stand-in: {e}")
    return faults


def main(argv):
    args = parse_args(argv)
    instance = args.instance or secrets.token_hex(4)
    if not all(c.isalnum() or c in "-_." for c in instance):
        sys.exit(f"k8s stand-in: --instance {instance!r}: letters, digits, '-', '_' and '.' only")
    faults = load_faults(args)

    def log(message):
        print(f"k8s stand-in: {message}", file=sys.stderr, flush=True)

    store = PodStore(instance, args.docker_cli, log)
    Handler.store, Handler.faults, Handler.verbose = store, faults, args.verbose
    try:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    except OSError as e:
        sys.exit(f"k8s stand-in: cannot listen on 127.0.0.1:{args.port}: {e}")
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    log(f"instance {instance}: containers labelled swerve.k8s-standin.instance={instance}")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while not stop.wait(1.0):
        pass
    server.shutdown()
    removed = store.remove_all_containers()
    log(f"stopped; removed {removed} container(s)")
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
