"""``python -m ipyparallel_broadcast.launch.tree``: print a running cluster's relay tree.

Shows depth, fan-out and which engines each leaf serves. Connects like
``ipyparallel.Client`` (``--profile``, ``--profile-dir``, ``--cluster-id``,
or a connection file as the first argument).
"""

import argparse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url_file", nargs="?", help="ipcontroller-client.json")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--profile-dir", default=None)
    parser.add_argument("--cluster-id", default=None)
    args = parser.parse_args(argv)
    from ..client.client import Client

    kwargs = {k: v for k, v in vars(args).items() if v is not None}
    rc = Client(**kwargs)
    try:
        print(rc.broadcast_tree())
    finally:
        rc.close()


if __name__ == "__main__":
    main()
