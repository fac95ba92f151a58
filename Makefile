# The front door: every routine action is one target. `make` lists them.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
DEV := $(VENV)/dev/bin/python
SERVICES := asr llm tts
# cuda: the engines' CUDA builds (make setup) and the GPU presets and sweeps (make run)
DEVICE ?= cpu

.DEFAULT_GOAL := help
.PHONY: compose-test soak plan help setup protos run serve sweep test lint serve-asr serve-llm serve-tts clean bench-llm bench-asr bench-tts

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: ## build the four virtualenvs (dev + one per service) and generate protos; a second run does nothing (DEVICE=cuda: CUDA builds)
	@PYTHON=$(PYTHON) DEVICE=$(DEVICE) tools/setup.sh $(SERVICES)
	@tools/install_deploy_tools.sh
	@$(MAKE) --no-print-directory protos

protos: voiceagent/v1/.generated ## generate the gRPC stubs in voiceagent/v1/ from protos/ (never edit the output)

$(VENV)/dev/.stamp:
	@PYTHON=$(PYTHON) tools/make_venv.sh dev requirements/dev.txt

voiceagent/v1/.generated: $(wildcard protos/voiceagent/v1/*.proto) | $(VENV)/dev/.stamp
	@rm -rf voiceagent/v1 && mkdir -p voiceagent/v1
	@$(DEV) -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/voiceagent/v1/*.proto
	@touch $@
	@echo "protos: generated $$(ls voiceagent/v1/*_pb2*.py | wc -l) modules in voiceagent/v1/"

run: setup ## the main job: start the services, sweep each and a voice turn, compare with vllm serve, report (DEVICE=cuda: on a GPU)
	@$(DEV) -m loadgen run$(if $(filter cuda,$(DEVICE)), --device cuda)

serve: setup ## start the three services on their CPU presets and default ports (Ctrl-C stops them)
	@tools/run_services.sh

TARGET ?= llm
CONCURRENCY ?= 1,2,4,8,16
SESSIONS ?= 100
RUN ?= $(lastword $(sort $(wildcard reports/*-run)))
sweep: ## sweep running services: make sweep TARGET=asr|llm|tts|voice|openai CONCURRENCY=1,2,4 ARGS="--duration-s 20"
	@$(DEV) -m loadgen sweep --target $(TARGET) --concurrency $(CONCURRENCY) $(ARGS)

plan: ## capacity plan from measured sweeps: make plan RUN=reports/<run> SESSIONS=100 ARGS="--llm-ttft-p95 0.5"
	@$(DEV) -m loadgen plan $(RUN) --sessions $(SESSIONS) $(ARGS)

SOAK_S ?= 1800
soak: setup ## start the services, load all three and the voice turn with cancels and disconnects for SOAK_S (30 min), check nothing leaks
	@$(DEV) -m loadgen.soak --duration-s $(SOAK_S) $(ARGS)

test: ## set up if needed, lint, run every test suite and the compose stage (COMPOSE_TEST=0: without it), timing each
	@tools/test.sh

compose-test: setup ## build the images for real and test the compose stack (installs/starts docker.io if missing)
	@tools/compose_test.sh

lint: ## ruff over everything but generated code
	@$(VENV)/dev/bin/ruff check . && $(VENV)/dev/bin/ruff format --check .

serve-asr: ## run the ASR service in the foreground
	@$(VENV)/asr/bin/python -m services.asr

serve-llm: ## run the LLM service in the foreground
	@$(VENV)/llm/bin/python -m services.llm

serve-tts: ## run the TTS service in the foreground
	@$(VENV)/tts/bin/python -m services.tts

clean: ## remove virtualenvs, generated code and reports
	rm -rf $(VENV) voiceagent/v1 reports

bench-llm: ## benchmark: LLM engine-direct vs gRPC service (prints a table)
	@$(VENV)/llm/bin/python -m services.llm.benchmark

bench-asr: ## benchmark: ASR real-time stream capacity per chunk size, cache-aware vs buffered vs engine-direct
	@$(VENV)/asr/bin/python -m services.asr.benchmark

bench-tts: ## benchmark: TTS batched service vs worker pool vs VoxCPM direct by concurrency (first audio, RTF, audio s/s)
	@$(VENV)/tts/bin/python -m services.tts.benchmark
