# The README's two commands: `make demo` and `make test`. Each builds .venv/ first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Without a GPU take the local CPU build; never let pip pull the multi-GB CUDA wheel there.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
SAMPLE ?= build/sample
DEMO   ?= build/demo

.PHONY: install test test-rest test-full demo clean fuzz

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py datapipe/_jpeg_region.c datapipe/_normalize.c datapipe/_warp.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	@$(BIN)/python -c "from datapipe.augment.view import region_decoder_available as b; print('region JPEG decoder:', \
		'in use' if b() else 'NOT in use (no libjpeg headers: apt-get install libjpeg-dev, then make clean install)')"
	touch $@

# Two pytest workers (pytest-xdist), a test file each at a time: the suite's multi-process tests leave
# room on two cores. The temp folder is short: a Unix socket path under it must stay below 108 bytes.
# One OpenMP thread a process (as torchrun sets): two workers and their children each spinning a thread
# per core oversubscribe two cores; tests/train took 126 s so, 47 s with it.
# --no-loadscope-reorder: files are dealt in the order tests/conftest.py gives (slowest first); xdist 3.5+
# otherwise re-sorts them by their number of tests, which dealt the few long trainer files last.
# Bytecode caches are written even where the shell sets PYTHONDONTWRITEBYTECODE (this machine does): else
# each of the suite's ~300 interpreters compiles datapipe again (~0.25 s of CPU) and each worker
# rewrites every test module's asserts again (__pycache__/ is ignored by git).
# --max-worker-restart=0: a worker that dies fails the run; replaced, its files' scheduling once hung (loadfile).
# The temp folder goes whatever the outcome: a run leaves ~6 GB there (five failed runs filled a disk here).
# make test leaves out the tests marked `full`: the docs' runnable blocks and further end-to-end variants of
# claims it proves end to end (another start method, launcher or fault of the same run). make test-rest
# runs those alone, make test-full everything at once; CI runs make test, then make test-rest.
TEST_WORKERS ?= 2
TEST_SELECT  ?= not full
test: install
	@tmp=$$(mktemp -d /tmp/dpt-XXXXXX) && OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} PYTHONDONTWRITEBYTECODE= \
		$(BIN)/python -m pytest -q -m "$(TEST_SELECT)" \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --basetemp=$$tmp; \
		rc=$$?; rm -rf $$tmp; exit $$rc

test-rest:
	@$(MAKE) --no-print-directory test TEST_SELECT=full

test-full:
	@$(MAKE) --no-print-directory test TEST_SELECT=

# bench times a loader row only over 50 batches per worker after its warm-up: the sample's 604 records
# give that at --batch-size 4 with 2 workers (at 32 every loader row would say "too short").
demo: install
	$(BIN)/python tools/make_sample.py --out $(SAMPLE) --overwrite
	$(BIN)/datapipe convert $(SAMPLE) $(DEMO)/sample.lmdb --overwrite
	$(BIN)/datapipe convert $(SAMPLE) $(DEMO)/sample.h5 --overwrite
	$(BIN)/datapipe convert $(SAMPLE) $(DEMO)/sample.wds --overwrite --shard-size 8MB
	$(BIN)/datapipe info $(DEMO)/sample.lmdb
	$(BIN)/datapipe info $(DEMO)/sample.h5
	$(BIN)/datapipe info $(DEMO)/sample.wds
	$(BIN)/datapipe doctor $(DEMO)/sample.lmdb
	$(BIN)/datapipe preview $(DEMO)/sample.lmdb --recipe deit --out $(DEMO)/preview.png --records 4 --image-size 96
	$(BIN)/datapipe bench $(DEMO)/sample.lmdb $(DEMO)/sample.h5 $(DEMO)/sample.wds --batch-size 4 --workers 2 \
		--seconds 2 --repeats 3 --json $(DEMO)/bench.json --plot $(DEMO)/bench.png
	$(BIN)/datapipe train $(DEMO)/sample.lmdb --model resnet18 --epochs 1 --batch-size 32 --image-size 128 \
		--lr 0.05 --log-every 5 --out $(DEMO)/train

# Coverage-guided fuzzing (atheris) of the JPEG marker parser, the C region decoder (then its
# AddressSanitizer build), the tar indexer, the manifest reader and the rest of fuzz/targets.py:
# FUZZ_SECONDS per target; FUZZ_TARGETS (empty: every target) to pick.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: install
	$(BIN)/python -c "import atheris" 2>/dev/null || $(BIN)/pip install -q -e ".[fuzz]"
	PYTHON=$(BIN)/python FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" sh fuzz/all.sh

clean:
	rm -rf build $(VENV)
