#!/usr/bin/env bash
# The tools outside Python that some labs drive, installed once (idempotent; `make setup` runs this):
#   - Prometheus and promtool (Debian's `prometheus` package) for labs 22-23: scraping, rules, alerts;
#   - nginx (Debian's `nginx` package) for lab 24's gateway: API keys, rate limits, a canary and its rollback;
#   - npm packages with the Kubernetes CRD schemas (KEDA, Gateway API, Prometheus Operator) that validate the
#     phase 4 manifests offline, under .npm-fleet/.
# A tool that cannot be installed here is reported with what to do; the tests that need it then say so too.
set -u
cd "$(dirname "$0")/.."
status=0

# Debian packages: Prometheus (promtool with it) and nginx. nginx's package would start a service on port 80: a
# policy-rc.d that answers 101 keeps it from starting (the labs run their own nginx on a free loopback port).
apt_missing=""
command -v promtool >/dev/null 2>&1 || apt_missing="$apt_missing prometheus"
{ command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } || apt_missing="$apt_missing nginx"
if [ -n "$apt_missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then SUDO=""
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then SUDO="sudo"
  else SUDO="none"
  fi
  if [ "$SUDO" = none ]; then
    echo "install_tools: missing$apt_missing and apt-get is not available as root. Install Prometheus 2.x" \
         "(https://prometheus.io/download/: put prometheus and promtool on PATH) for labs 22-23, and nginx" \
         "(https://nginx.org/en/linux_packages.html) for lab 24." >&2
    status=1
  else
    echo "== installing$apt_missing (Debian packages; no service is started, none is enabled for the next boot)"
    policy=""
    POLICY_RC_D=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
    if [ ! -e "$POLICY_RC_D" ]; then
      policy=$POLICY_RC_D  # ours: removed however this script ends (an interrupted apt-get included)
      trap '$SUDO rm -f "$policy"' EXIT
      trap 'exit 130' INT TERM
      printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy"
    fi
    before=$(dpkg-query -W -f='${Package}\n' 2>/dev/null | sort)
    ($SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $apt_missing >/dev/null) || status=1
    # The packages enable their services for the next boot (a Prometheus on :9090, an nginx on :80 on a pod that
    # restarts): disabled here, only those of the packages this install added (a machine's own are left alone).
    added=$(comm -13 <(echo "$before") <(dpkg-query -W -f='${Package}\n' 2>/dev/null | sort))
    for pkg in $added; do
      for f in $(dpkg -L "$pkg" 2>/dev/null | grep -E '(/systemd/system/[^/]+\.(service|socket|timer)|^/etc/init\.d/[^/]+)$'); do
        case $f in
          /etc/init.d/*) command -v update-rc.d >/dev/null 2>&1 && $SUDO update-rc.d "$(basename "$f")" disable >/dev/null 2>&1 ;;
          *) command -v deb-systemd-helper >/dev/null 2>&1 && $SUDO deb-systemd-helper disable "$(basename "$f")" ;;
        esac
      done
    done
    if [ -n "$policy" ]; then $SUDO rm -f "$policy"; trap - EXIT; fi
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
