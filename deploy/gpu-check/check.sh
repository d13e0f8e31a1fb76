#!/bin/sh
# Run on a CUDA machine lent by the device tool (no registry, no model files), in the repository's root,
# after fetch.sh here; carry .whl and .device-kit. Steps, any of (in this order when several):
#   tests  the GPU-marked step-shape tests (bf16 and int8 on CUDA, eager and compiled) and sampler tests
#   speed  homeai bench speed --shape llama-3.2-1b (or $SHAPE) --device cuda --compile --transformers, batch 1/16/64
#   serve  homeai bench serve with its defaults on a random-weight Llama-3.2-1B (random_model.py)
# Figures and logs go to $OUT (the device tool brings them back), else to ./gpu-check-out.
set -u
out=${OUT:-gpu-check-out}
mkdir -p "$out"
py=${PY:-python3}  # PY=.venv/bin/python SHAPE=smollm2-135m: the same steps on a machine set up by make install
shape=${SHAPE:-llama-3.2-1b}
export PYTHONUNBUFFERED=1 HOMEAI_MODELS_DIR=/tmp/gpu-check/models
export PYTHONPATH=/tmp/site:$PWD
if ! $py -c 'import litestar' 2>/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
status=0
for step in "$@"; do
    case $step in
    tests)
        # (test_embedder's GPU test needs MiniLM's files, which are not there)
        $py -m pytest -q -p no:cacheprovider -m gpu -o addopts= --timeout 300 \
            tests/unit/runtime/test_step_shapes.py tests/unit/runtime/test_sampler.py \
            > "$out/tests.log" 2>&1 || status=1
        tail -5 "$out/tests.log" ;;
    speed)
        $py -m homeai.cli.main bench speed --shape "$shape" --device cuda --compile --transformers \
            --batch 1,16,64 --json > "$out/speed.json" 2> "$out/speed.log" || status=1
        tail -3 "$out/speed.log"; cat "$out/speed.json" ;;
    serve)
        model=/tmp/gpu-check/$shape-random
        if [ ! -f "$model/model.safetensors" ]; then
            $py -m homeai.bench.random_model --shape "$shape" --tokenizer-from .device-kit/tokenizer \
                --out "$model" --policy-out /tmp/gpu-check/policy.yaml --name "$shape-random" || exit 1
            $py -m homeai.cli.main pull "$model" --as "$shape-random" || exit 1
        fi
        $py -m homeai.cli.main bench serve --policy /tmp/gpu-check/policy.yaml --kv-cache-mb 4096 \
            --phases ${PHASES:-single,idle,streams,household} --streams-s ${STREAMS_S:-10} \
            --household-s ${HOUSEHOLD_S:-30} --json \
            > "$out/serve.json" 2> "$out/serve.log" || status=1
        tail -5 "$out/serve.log"; cat "$out/serve.json" ;;
    *) echo "unknown step $step (tests, speed, serve)"; exit 2 ;;
    esac
done
exit $status
