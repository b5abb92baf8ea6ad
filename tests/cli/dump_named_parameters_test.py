#!/usr/bin/env python3
"""The dump script's pure-Python part, without torch: records, validation, atomic files."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
import dump_named_parameters as dnp  # noqa: E402


class FakeParam:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


class FakeModule:
    def named_parameters(self):
        yield "model.layers.0.mlp.experts.w13_weight", FakeParam((16, 5760, 2880), "torch.bfloat16")
        yield "model.norm.weight", FakeParam((2880,), "torch.float32")


class DumpTest(unittest.TestCase):
    def test_dtype_names_drop_the_torch_prefix(self):
        self.assertEqual(dnp.dtype_name("torch.float8_e4m3fn"), "float8_e4m3fn")
        self.assertEqual(dnp.dtype_name("BF16"), "BF16")

    def test_padding_needs_one_entry_per_dim(self):
        with self.assertRaisesRegex(ValueError, "one entry per dim"):
            dnp.param_record("x", (4, 8), "bfloat16", padding=[0])

    def test_rank_outside_world_is_refused(self):
        with self.assertRaisesRegex(ValueError, "rank 4"):
            dnp.rank_record(4, 4, [])

    def test_module_dump_round_trips(self):
        own = {"model.layers.0.mlp.experts.w13_weight":
               {"slices": [{"dim": 0, "begin": 16, "end": 32}], "padding": [0, 0, 0]}}
        with tempfile.TemporaryDirectory() as d:
            path = dnp.dump_module(FakeModule(), rank=1, world=2, out_dir=d, engine="fake",
                                   ownership=own)
            self.assertTrue(path.endswith("rank-00001.json"))
            self.assertEqual(os.listdir(d), ["rank-00001.json"])  # no temporary left behind
            with open(path) as f:
                rec = json.load(f)
        self.assertEqual((rec["format"], rec["world"], rec["rank"]), (dnp.FORMAT, 2, 1))
        w13, norm = rec["params"]
        self.assertEqual(w13["shape"], [16, 5760, 2880])
        self.assertEqual(w13["dtype"], "bfloat16")
        self.assertEqual(w13["slices"], [{"dim": 0, "begin": 16, "end": 32}])
        self.assertNotIn("slices", norm)
        self.assertEqual(norm["dtype"], "float32")


if __name__ == "__main__":
    unittest.main()
