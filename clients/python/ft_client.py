"""A FasterTransformer-era token client, unchanged: unary gRPC `infer` with padded UINT32 ids.

Sends input_ids UINT32 [B, N] (right-padded), input_lengths UINT32 [B, 1] and request_output_len
UINT32 [B, 1]; reads output_ids [B, 1, L] (the prompt followed by the generated ids, padded) and
sequence_length [B, 1] (their count), as the FasterTransformer backend returned them. It sends
one prompt alone, then four as one batch, and checks that the batch's first row equals the
prompt sent alone (greedy: no sampling inputs).

    python clients/python/ft_client.py --url 127.0.0.1:8001 --model fastertransformer
"""
import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient

# Token ids of SmolLM2's tokenizer: "The capital of France is", "Once upon a time, there was a",
# "The quick brown fox", "In 1969, the first man on the moon was".
PROMPTS = [
    [504, 3575, 282, 4649, 314],
    [6403, 1980, 253, 655, 28, 665, 436, 253],
    [504, 2365, 6354, 16438],
    [788, 216, 33, 41, 38, 41, 28, 260, 808, 555, 335, 260, 6783, 436],
]
OUTPUT_LEN = 8


def tensor(name, array):
    t = grpcclient.InferInput(name, list(array.shape), "UINT32")
    t.set_data_from_numpy(array)
    return t


def infer(client, model, prompts):
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), dtype=np.uint32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    lengths = np.array([[len(p)] for p in prompts], dtype=np.uint32)
    output_len = np.full((len(prompts), 1), OUTPUT_LEN, dtype=np.uint32)
    result = client.infer(model, [tensor("input_ids", ids), tensor("input_lengths", lengths),
                                  tensor("request_output_len", output_len)],
                          outputs=[grpcclient.InferRequestedOutput("output_ids"),
                                   grpcclient.InferRequestedOutput("sequence_length")])
    output_ids, seq_len = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
    return [output_ids[i, 0, :seq_len[i, 0]].tolist() for i in range(len(prompts))], output_ids.shape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8001", help="gRPC host:port")
    ap.add_argument("--model", default="fastertransformer")
    args = ap.parse_args()
    client = grpcclient.InferenceServerClient(args.url)
    alone, shape = infer(client, args.model, PROMPTS[:1])
    print(f"batch 1: output_ids shape {list(shape)}")
    print(f"  row 0: {alone[0]}")
    rows, shape = infer(client, args.model, PROMPTS)
    print(f"batch {len(PROMPTS)}: output_ids shape {list(shape)}")
    for i, row in enumerate(rows):
        echoed = row[:len(PROMPTS[i])] == PROMPTS[i]
        print(f"  row {i}: {row} (prompt echoed: {echoed}, generated: {len(row) - len(PROMPTS[i])})")
    same = rows[0] == alone[0]
    print(f"row 0 of the batch equals the prompt sent alone: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
