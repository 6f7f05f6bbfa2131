# Two commands do all set-up on a fresh machine:
#   make up     run the demo cluster (private PostgreSQL and Redis under var/)
#   make down   stop the demo from any terminal: a running `make up`, then the demo jobs,
#               PostgreSQL and Redis, which Ctrl-C leaves running
#   make test   run the whole test suite (private PostgreSQL and Redis on free ports)

VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up down test lint format system-packages frontend screenshots clean

$(STAMP): requirements.txt pyproject.toml
	@PY=$$(scripts/find-python.sh) || exit 1; \
	if [ ! -x $(VPY) ] || ! $(VPY) -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
		rm -rf $(VENV); echo "Creating $(VENV) with $$PY"; "$$PY" -m venv $(VENV); fi
	$(VPY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@if grep -q '^\[build-system\]' pyproject.toml; then $(VPY) -m pip install -q --disable-pip-version-check --no-deps -e .; fi
	@touch $(STAMP)

system-packages:
	@bash scripts/system-packages.sh up

frontend:
	@if [ -f scripts/build-frontend.sh ]; then bash scripts/build-frontend.sh; fi

up: system-packages $(STAMP) frontend
	$(VPY) -m portal.devstack up

down:
	@if [ -x $(VPY) ]; then $(VPY) -m portal.devstack down; fi

test: $(STAMP)
	@bash scripts/system-packages.sh test
	@$(MAKE) --no-print-directory frontend
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VPY) -m portal.devstack test

screenshots: $(STAMP) frontend
	$(VPY) -m tests.browser.screenshots

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean: down
	rm -rf $(VENV) var
