# kvbench front door. `make test` and `make sweep` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.kvbench-installed
# Offline machines (the lent GPU box): put wheels here and they are used first.
WHEELS ?= wheels
PIP_LOCAL := $(if $(wildcard $(WHEELS)/*),--find-links $(WHEELS),)
# A system Python whose torch sees a GPU is reused (its CUDA torch is kept);
# otherwise the venv is isolated and gets the small CPU wheel of torch.
HAS_CUDA_TORCH := $(shell $(PYTHON) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && echo 1)
CPU_TORCH ?= torch==2.13.0
# Where that wheel comes from: pip's configured indexes by default (a local CPU wheel on the
# project's machines). Plain PyPI's Linux torch is the CUDA build (GBs of CUDA libraries):
# there, `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` gets the CPU one.
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: setup test test-fast sweep report clock-runs bench clock-check gpu-check wheels clean help

help:
	@echo "make setup | test | sweep | report | clock-runs | bench | clock-check | gpu-check | clean"

setup: $(STAMP)

# One line per step, each naming what it installs and from where (pip's own output is quiet).
FROM := $(if $(PIP_LOCAL), (with the wheels in $(WHEELS)/),)
$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "setup: $(VENV): a new venv ($(if $(HAS_CUDA_TORCH),reusing the system Python's CUDA torch,isolated))"; \
	  $(PYTHON) -m venv $(if $(HAS_CUDA_TORCH),--system-site-packages,) $(VENV); }
	@if v=$$($(PY) -c "import torch; print(torch.__version__)" 2>/dev/null); then \
	  echo "setup: torch $$v is already there: kept"; \
	else echo "setup: torch: the CPU build ($(CPU_TORCH))$(FROM)$(if $(TORCH_INDEX), from $(TORCH_INDEX),)"; \
	  $(PIP) install -q $(PIP_LOCAL) $(TORCH_FROM) "$(CPU_TORCH)"; fi
	@echo "setup: kvbench (editable, with the kvbench command) and its test extras (pyproject.toml [test])$(FROM)"
	@$(PIP) install -q $(PIP_LOCAL) -e ".[test]"
	@touch $(STAMP)

# The suite runs in TEST_JOBS processes (pytest-xdist), a test file to a process so that a file's shared
# fixtures are built once: 12-15 min on a 2-core machine where one process took 21. One per core, at
# most 4. 0 runs them in pytest's own process, as on a machine whose torch sees a GPU: there the GPU
# tests' memory and NVML readings must not share the device with another test process.
TEST_JOBS ?= $(if $(HAS_CUDA_TORCH),0,$(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 ))))
PYTEST := $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test: setup
	$(PYTEST)

# The unit tests of every room, without whole commands and benchmarks (tests/jobs, tests/bench) or the unit tests
# tests/slow_tests.txt lists (tests/conftest.py marks them slow): 1.5 min on the 2-core machine.
test-fast: setup
	$(PYTEST) -m "not slow"

# The default sweep for this device (conf/sweep/<device>_*.yaml) into
# results/<device-slug>/<sweep>/, then the report. It resumes: a job whose folder already
# holds its finished rows is skipped, and only missing, failed or interrupted ones run.
# FRESH=1 deletes that device's previous set first and runs every job. A sweep with a failed
# job does not stop the others; the report is still written, and make exits 1 at the end.
DEVICE_KIND := $(if $(HAS_CUDA_TORCH),gpu,cpu)
ALL_SWEEPS := $(sort $(basename $(notdir $(wildcard conf/sweep/$(DEVICE_KIND)_*.yaml))))
# On CPU the clock sweep serves cpu_service's, cpu_service_chunked's and cpu_max_rate's runs itself, in
# the process that measured its profile (conf/sweep/cpu_clock.yaml says why): those three are for running
# alone, and the default set leaves them out.
COVERED := $(if $(filter cpu,$(DEVICE_KIND)),cpu_service cpu_service_chunked cpu_max_rate)
SWEEPS ?= $(filter-out $(COVERED),$(ALL_SWEEPS))
FRESH ?=
# Sweeps whose every job is bookkeeping only (scenario.bookkeeping: a simulated clock, nothing timed on
# this machine). After the timed sweeps, which run alone, these run SWEEP_JOBS at a time, each one's
# output printed whole when it ends, taken in this order: the longest first (49 s down to 5 s on the
# 2-core AMD machine), so that the last to start are short and the cores finish together.
# tests/unit/harness/front/test_resolve_every_sweep.py keeps this list equal to the sweeps whose jobs say so.
BOOKKEEPING := cpu_hybrid_capacity cpu_latent_capacity cpu_reuse cpu_fig12_max_rate cpu_fig12_block_size cpu_fig12_plan_70b cpu_fig12_alpaca \
  cpu_fig12_sharegpt cpu_reuse_policies cpu_chunked_prefill cpu_swap cpu_kv_dtype_capacity cpu_capacity
SWEEP_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
TIMED_SWEEPS := $(filter-out $(BOOKKEEPING),$(SWEEPS))
BOOKED_SWEEPS := $(filter $(SWEEPS),$(BOOKKEEPING))
RUN_SWEEP = $(PY) -m harness -m +sweep=$$s resume=true hydra/job_logging=disabled

sweep: setup
	@slug=$$($(PY) -c "from kvbench.harness.measure.fingerprint import auto_device_slug as s; print(s())"); \
	failed=$$(mktemp); logs=$$(mktemp -d); \
	if [ "$(FRESH)" = 1 ]; then rm -rf "results/$$slug"; fi; \
	for s in $(TIMED_SWEEPS); do \
	  echo "== sweep $$s -> results/$$slug/$${s#$(DEVICE_KIND)_}"; \
	  $(RUN_SWEEP) || echo "$$s" >> $$failed; \
	done; \
	export slug failed logs; \
	printf '%s\n' $(BOOKED_SWEEPS) | xargs -r -P $(SWEEP_JOBS) -I{} bash -c 's={}; \
	  { echo "== sweep $$s -> results/$$slug/$${s#$(DEVICE_KIND)_} (bookkeeping: $(SWEEP_JOBS) sweeps at a time)"; \
	    $(RUN_SWEEP) 2>&1 || echo "$$s" >> $$failed; } > $$logs/$$s.log; cat $$logs/$$s.log'; \
	rm -rf $$logs; \
	$(PY) -m harness.report results/ || exit 1; \
	if [ -s $$failed ]; then echo "kvbench: sweeps with a failed job: $$(tr '\n' ' ' < $$failed)(their rows say why)"; \
	  rm -f $$failed; exit 1; fi; rm -f $$failed

report: setup  # the published report, results/REPORT.md (python -m harness.report alone reads your runs/)
	$(PY) -m harness.report results/

# The simulated clock priced against published real-GPU figures (docs/validation/published_points.csv):
# writes docs/clock_validation.md and docs/validation/clock_errors.csv (a few minutes on 2 cores).
clock-check: setup
	$(PY) -m harness.front.clock_check

# The simulated clock's validation on this machine RUNS times over (default 3), one after another, each its clock
# sweeps (conf/sweep/<device>_clock*.yaml) into runs/clock-runs/<time>/<n>/; then each run's median errors, their
# median and range, and the most runs in a row within 10% (CLOCK_RUNS.md there). 4.5-6.5 min a run on 2 cores.
RUNS ?= 3
CLOCK_SWEEPS := $(sort $(basename $(notdir $(wildcard conf/sweep/$(DEVICE_KIND)_clock*.yaml))))
clock-runs: setup
	@set -o pipefail; out=runs/clock-runs/$$(date +%Y%m%d-%H%M%S); failed=; \
	for n in $$(seq 1 $(RUNS)); do for s in $(CLOCK_SWEEPS); do \
	  echo "== run $$n of $(RUNS): $$s -> $$out/$$n/$${s#$(DEVICE_KIND)_}"; \
	  $(PY) -m harness -m +sweep=$$s hydra.sweep.dir=$$out/$$n/$${s#$(DEVICE_KIND)_} hydra/job_logging=disabled \
	    || failed="$$failed $$n/$$s"; done; done; \
	$(PY) -m harness.report.clock_runs $$(seq -f "$$out/%g" 1 $(RUNS)) | tee $$out/CLOCK_RUNS.md || exit 1; \
	if [ -n "$$failed" ]; then echo "kvbench: runs with a failed job:$$failed (their rows say why)"; exit 1; fi

bench: setup
	$(PY) -m pytest tests/bench --benchmark-enable -q

# Runs cold on a GPU machine, even offline (see .ci/gpu-check); no `setup` needed.
gpu-check:
	bash .ci/gpu-check

# Wheels the offline GPU machine lacks, for `make gpu-check` there.
wheels: setup
	$(PIP) download -q --no-deps -d $(WHEELS) "hydra-core==1.3.*" "omegaconf>=2.2,<2.4" \
	  "hydra-joblib-launcher==1.2.*" joblib
	$(PIP) wheel -q --no-deps -w $(WHEELS) antlr4-python3-runtime==4.9.3
	$(PIP) download -q --no-deps -d $(WHEELS) --only-binary=:all: --python-version 3.12 \
	  --platform manylinux2014_x86_64 PyYAML

clean:
	rm -rf $(VENV) multirun outputs runs .pytest_cache .hypothesis .benchmarks
