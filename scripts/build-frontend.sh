#!/usr/bin/env bash
# Builds the web app in frontend/: npm ci (only when the lock file changed), API types from the
# OpenAPI schema, type-check, Vite build into frontend/dist, unit tests. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FE=$ROOT/frontend
PY=${PYTHON:-$ROOT/.venv/bin/python}
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

command -v npm >/dev/null 2>&1 || { echo "build-frontend: npm (11 or newer) is needed to build the web app" >&2; exit 1; }
NPM_MAJOR=$(npm --version 2>/dev/null | cut -d. -f1)
if [ "${NPM_MAJOR:-0}" -lt 11 ]; then
  echo "build-frontend: npm $(npm --version) is too old; the build needs npm 11 or newer" >&2
  exit 1
fi

step() { echo "[frontend] $*"; }

# 1. dependencies: npm ci only when node_modules does not match package-lock.json
STAMP=$FE/node_modules/.lock-stamp
LOCK_SUM=$(sha256sum "$FE/package-lock.json" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$LOCK_SUM" ]; then
  step "npm ci"
  (cd "$FE" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$LOCK_SUM" > "$STAMP"
fi

# 2. API types from the OpenAPI schema (the one source of the API's shapes)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
step "API types from the OpenAPI schema"
# (schema warnings about views are the backend's business; they are shown only if generation fails)
if ! DEBUG=true "$PY" manage.py spectacular --file "$TMP/schema.yaml" >"$TMP/spectacular.log" 2>&1; then
  cat "$TMP/spectacular.log" >&2
  echo "build-frontend: the OpenAPI schema could not be generated" >&2
  exit 1
fi
GENERATED=$FE/src/api/schema.d.ts
(cd "$FE" && npx --no-install openapi-typescript "$TMP/schema.yaml" -o "$TMP/schema.d.ts" >/dev/null)
if ! cmp -s "$TMP/schema.d.ts" "$GENERATED"; then cp "$TMP/schema.d.ts" "$GENERATED"; fi

# 3. type-check, build, unit tests; skipped when nothing that goes into the build changed
BUILD_STAMP=$FE/dist/.build-stamp
SOURCES_SUM=$(cd "$FE" && find src index.html vite.config.ts tsconfig.json package-lock.json -type f -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ -f "$BUILD_STAMP" ] && [ -f "$FE/dist/index.html" ] && [ "$(cat "$BUILD_STAMP")" = "$SOURCES_SUM" ]; then
  step "frontend/dist is up to date"
  exit 0
fi
step "type-check"
(cd "$FE" && npx --no-install tsc --noEmit)
step "vite build"
(cd "$FE" && npx --no-install vite build --logLevel warn)
step "unit tests"
(cd "$FE" && npx --no-install vitest run --reporter=dot)
echo "$SOURCES_SUM" > "$BUILD_STAMP"
step "built frontend/dist"
