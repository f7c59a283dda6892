#!/usr/bin/env bash
# On the benchmark host (any Linux machine reached over SSH, a GCE VM included):
# install the project at one commit from a git bundle, raise the OS limits many
# engines need, run the asv suites with a machine profile, and pack the results.
#
#   remote-run.sh --bundle ipb.bundle --commit SHA --profile vm16 --machine NAME \
#                 [--quick] [--bench REGEX]... [--apt] [--mpi] [--workdir DIR]
#
# --apt: install packages with apt-get (sudo) and raise the OS limits;
# --mpi: build mpi4py against the host's MPI, for the MPI peer suite.
#
# Prints "RESULTS <path of a .tar.gz>" as its last line; the archive holds
# asv-results/<machine>/ (the result files) and asv-results/benchmarks.json.
set -euo pipefail

bundle="" commit="" profile="" machine="" quick="" apt="" mpi="" workdir="$HOME/ipb-bench"
bench=()
while (($#)); do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --commit) commit="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --machine) machine="$2"; shift 2 ;;
    --bench) bench+=(--bench "$2"); shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --quick) quick="--quick"; shift ;;
    --apt) apt=1; shift ;;
    --mpi) mpi=1; shift ;;
    *) echo "remote-run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in bundle commit profile machine; do
  [[ -n "${!v}" ]] || { echo "remote-run.sh: --$v is required" >&2; exit 2; }
done

as_root() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }

if [[ -n "$apt" ]]; then  # a fresh VM image: Python, git, a compiler, MPI for the peer suite
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    python3-venv python3-dev git gcc mpich libmpich-dev
  # many engines: open files, processes, listen backlog, ephemeral ports
  printf '* soft nofile 1048576\n* hard nofile 1048576\n* soft nproc unlimited\n* hard nproc unlimited\n' |
    as_root tee /etc/security/limits.d/90-ipb-bench.conf >/dev/null
  as_root sysctl -q -w fs.file-max=4194304 kernel.pid_max=4194304 kernel.threads-max=4194304 \
    net.core.somaxconn=65535 net.ipv4.ip_local_port_range="1024 65535"
  as_root prlimit --pid $$ --nofile=1048576:1048576 || true
fi
workdir="$(realpath -m "$workdir")" bundle="$(realpath "$bundle")"
ulimit -n "$(ulimit -Hn)"  # as many open files as this session may have
echo "open files limit: $(ulimit -n)"

# the project at that commit, in a fresh clone and environment
rm -rf "$workdir"
git clone -q "$bundle" "$workdir/src"
cd "$workdir/src"
git checkout -q -B main "$commit"  # asv follows the branch named in asv.conf.json
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[bench]"
if [[ -n "$mpi" ]]; then  # the MPI peer: mpi4py built against this host's MPI
  .venv/bin/python -m pip install -q --no-binary mpi4py mpi4py || echo "mpi4py not built: MPI peer skipped"
fi

status=0
.venv/bin/python benchmarks/scripts/run_asv.py --profile "$profile" --machine "$machine" $quick "${bench[@]}" || status=$?

# pack what was measured, even if some benchmarks failed
archive="$workdir/ipb-results-$machine-${commit:0:8}.tar.gz"
tar -czf "$archive" -C benchmarks asv-results/benchmarks.json "asv-results/$machine"
echo "asv exit status: $status"
echo "RESULTS $archive"
