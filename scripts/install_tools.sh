#!/usr/bin/env bash
# The tools outside Python that some labs drive, installed once (idempotent; `make setup` runs this):
#   - Prometheus and promtool (Debian's `prometheus` package) for labs 22-23: scraping, rules, alerts;
#   - npm packages with the Kubernetes CRD schemas (KEDA, Gateway API, Prometheus Operator) that validate the
#     phase 4 manifests offline, under .npm-fleet/.
# A tool that cannot be installed here is reported with what to do; the tests that need it then say so too.
set -u
cd "$(dirname "$0")/.."
status=0

if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Prometheus (Debian package; no service is started)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) || status=1
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Prometheus with sudo"
    (sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) || status=1
  else
    echo "install_tools: Prometheus is not installed and apt-get is not available as root. Install Prometheus 2.x" \
         "(https://prometheus.io/download/: put prometheus and promtool on PATH) for labs 22-23." >&2
    status=1
  fi
fi

# The package's python: .venv's under `make setup`, the runtime's on Colab (PYTHON, or python3)
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
NPM_PACKAGES=$("$PY" -c 'from helpers.fleet.validate import NPM_PACKAGES; print(" ".join(NPM_PACKAGES))' 2>/dev/null)
if [ -z "$NPM_PACKAGES" ]; then
  echo "install_tools: $PY cannot import helpers.fleet.validate, so the npm CRD schemas were not installed: install" \
       "the package first (make setup, or scripts/colab_setup.py)." >&2
  status=1
fi
if [ -n "$NPM_PACKAGES" ]; then
  missing=0
  for p in $NPM_PACKAGES; do
    name=${p%@*}
    [ -d ".npm-fleet/node_modules/$name" ] || missing=1
  done
  if [ $missing = 1 ]; then
    if command -v npm >/dev/null 2>&1; then
      echo "== installing npm packages with the CRD schemas into .npm-fleet/"
      npm install --silent --no-audit --no-fund --prefix .npm-fleet $NPM_PACKAGES >/dev/null || status=1
    else
      echo "install_tools: npm is missing: install Node.js 20+ (apt-get install nodejs npm) to validate the" \
           "phase 4 manifests offline." >&2
      status=1
    fi
  fi
fi
exit $status
