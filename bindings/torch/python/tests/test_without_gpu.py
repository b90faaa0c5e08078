"""cachalot_torch on a machine without a GPU (CI, this one): the package imports, says clearly
that CUDA is missing, and its stats, history and snapshots work on a simulated device, driven
through the same C functions PyTorch calls (here through ctypes).

    python3 -m unittest discover -s bindings/torch/python/tests      (scripts/dev/torch-python-test.sh)
"""
import ctypes
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

import cachalot_torch
from cachalot_torch import _native

ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
MIB = 1 << 20


def cuda_usable():
    return not cachalot_torch.cuda_status(0).startswith(cachalot_torch.CUDA_NOT_USABLE)


class WithoutGpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _native.configure("", 1 << 30)
        addresses = _native.function_addresses()
        cls.alloc = ALLOC(addresses["alloc"])
        cls.free = FREE(addresses["free"])
        cls.last_error = LAST_ERROR(addresses["last_error"])

    def error(self):
        kind = ctypes.c_int(-1)
        message = self.last_error(ctypes.byref(kind))
        return kind.value, message.decode()

    @unittest.skipIf(cuda_usable(), "a CUDA device is usable here")
    def test_cuda_status_says_why_cuda_is_not_usable(self):
        status = cachalot_torch.cuda_status(0)
        self.assertTrue(status.startswith("CUDA is not usable here: "), status)
        self.assertTrue("libcuda" in status or "device" in status, status)

    @unittest.skipIf(cuda_usable(), "a CUDA device is usable here")
    def test_enable_says_what_is_missing(self):
        with self.assertRaises(RuntimeError) as raised:
            cachalot_torch.enable()
        message = str(raised.exception)
        self.assertTrue("needs PyTorch" in message or "CUDA is not available" in message, message)
        self.assertFalse(cachalot_torch.is_enabled())

    def test_stats_history_and_snapshots_on_a_simulated_device(self):
        device = 7
        cachalot_torch.record_memory_history(max_entries=100)
        p = self.alloc(4 * MIB, device, None)
        self.assertTrue(p, self.error())
        # PyTorch's rules: a 4 MiB block in a 20 MiB segment.
        self.assertEqual(cachalot_torch.memory_allocated(device), 4 * MIB)
        self.assertEqual(cachalot_torch.memory_reserved(device), 20 * MIB)
        stats = cachalot_torch.memory_stats(device)
        self.assertEqual(stats["segment.all.current"], 1)
        self.assertEqual(list(stats), sorted(stats), "flat keys, sorted as torch.cuda.memory_stats")
        self.assertIn("PyTorch CUDA memory summary", cachalot_torch.memory_summary(device))
        self.free(p, 4 * MIB, device, None)
        self.assertEqual(cachalot_torch.memory_allocated(device), 0)
        self.assertEqual(cachalot_torch.max_memory_allocated(device), 4 * MIB)

        snap = cachalot_torch.snapshot()
        self.assertEqual([s["device"] for s in snap["segments"]], [device])
        actions = [e["action"] for e in snap["device_traces"][device]]
        self.assertEqual(actions, ["segment_alloc", "alloc", "free_requested", "free_completed"])
        path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
        cachalot_torch.dump_snapshot(path)
        with open(path, "rb") as f:
            self.assertEqual(pickle.load(f)["segments"], snap["segments"])

        cachalot_torch.reset_peak_memory_stats(device)
        self.assertEqual(cachalot_torch.max_memory_allocated(device), 0)
        cachalot_torch.empty_cache()
        self.assertEqual(cachalot_torch.memory_reserved(device), 0)
        cachalot_torch.record_memory_history(None)
        self.assertEqual(cachalot_torch.snapshot()["device_traces"][device], [])

    def test_history_records_the_python_stack_of_each_allocation_and_free(self):
        device = 9
        cachalot_torch.record_memory_history(context="all", max_entries=100)

        def allocate_activations():
            # ctypes releases the GIL around the call, as PyTorch's operators do: the allocator
            # takes it back to read this frame.
            return self.alloc(3 * MIB, device, None)

        def release_activations(p):
            self.free(p, 3 * MIB, device, None)

        p = allocate_activations()
        self.assertTrue(p, self.error())
        live = cachalot_torch.snapshot()
        block = next(b for s in live["segments"] if s["device"] == device for b in s["blocks"]
                     if b["state"] == "active_allocated")
        self.assertEqual(block["frames"][0]["name"], "allocate_activations")
        release_activations(p)
        trace = cachalot_torch.snapshot()["device_traces"][device]
        freed = [e["frames"][0]["name"] for e in trace if e["action"] == "free_requested"]
        self.assertEqual(freed, ["release_activations"], "context='all': the free's own stack")
        cachalot_torch.record_memory_history(None)

        path = os.path.join(tempfile.mkdtemp(), "stacks.pickle")
        cachalot_torch.record_memory_history(context="alloc", max_entries=100)
        q = allocate_activations()
        release_activations(q)
        cachalot_torch.dump_snapshot(path)
        cachalot_torch.record_memory_history(None)
        with open(path, "rb") as f:
            trace = pickle.load(f)["device_traces"][device]
        by_action = {e["action"]: e["frames"] for e in trace}
        alloc_frames = by_action["alloc"]
        self.assertEqual(alloc_frames[0]["name"], "allocate_activations")
        self.assertEqual(alloc_frames[0]["filename"], __file__)
        self.assertEqual(alloc_frames[1]["name"], "test_history_records_the_python_stack_of_each_allocation_and_free")
        self.assertGreater(alloc_frames[0]["line"], 0)
        # context="alloc": the free reports the allocation's stack, as PyTorch's does.
        self.assertEqual(by_action["free_requested"][0]["name"], "allocate_activations")
        cachalot_torch.empty_cache()

    def test_history_without_stacks_records_none(self):
        device = 10
        cachalot_torch.record_memory_history(context=None, max_entries=100)
        self.free(self.alloc(MIB, device, None), MIB, device, None)
        trace = cachalot_torch.snapshot()["device_traces"][device]
        cachalot_torch.record_memory_history(None)
        cachalot_torch.empty_cache()
        self.assertEqual([e.get("frames", []) for e in trace if e["action"] == "alloc"], [[]])

    def test_out_of_memory_leaves_pytorchs_message(self):
        device = 8
        cachalot_torch.set_per_process_memory_fraction(0.5, device)
        self.assertIsNone(self.alloc(600 * MIB, device, None))
        kind, message = self.error()
        self.assertEqual(kind, 1)
        self.assertTrue(message.startswith("CUDA out of memory. Tried to allocate 600.00 MiB."), message)
        self.assertIn("512.00 MiB allowed", message)
        self.assertEqual(_native.check_consistency(device), None)

    def test_torch_c_gets_nested_stats(self):
        nested = cachalot_torch._nested({"allocated_bytes.all.current": 3, "num_ooms": 1})
        self.assertEqual(nested, {"allocated_bytes": {"all": {"current": 3}}, "num_ooms": 1})

    def test_dump_snapshot_without_cachalot_as_the_allocator_raises_and_writes_nothing(self):
        # A fresh interpreter: this one's allocator has served the simulated devices above.
        path = os.path.join(tempfile.mkdtemp(), "run.pickle")
        script = ("import sys, cachalot_torch\n"
                  "try:\n    cachalot_torch.dump_snapshot(sys.argv[1])\n"
                  "except RuntimeError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, check=True)
        self.assertIn("cachalot is not this process's CUDA allocator", out.stdout, out.stderr)
        self.assertIn("cachalot_torch.enable()", out.stdout)
        self.assertFalse(os.path.exists(path), "no empty snapshot is written")

    def test_a_missing_compiler_is_named_before_the_shim_is_built(self):
        # torch.utils.cpp_extension as the check sees it where ninja and CUDA are there but no
        # compiler is: a stand-in package on the path of a fresh interpreter.
        root = tempfile.mkdtemp()
        os.makedirs(os.path.join(root, "torch", "utils"))
        for package in ("torch", os.path.join("torch", "utils")):
            open(os.path.join(root, package, "__init__.py"), "w").close()
        with open(os.path.join(root, "torch", "utils", "cpp_extension.py"), "w") as f:
            f.write("CUDA_HOME = '/usr/local/cuda'\ndef is_ninja_available():\n    return True\n")
        env = dict(os.environ, CXX="no-such-compiler-here",
                   PYTHONPATH=os.pathsep.join([root] + sys.path))
        script = ("import cachalot_torch\n"
                  "try:\n    cachalot_torch._check_shim_tools()\n"
                  "except RuntimeError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
        self.assertIn("needs a C++ compiler", out.stdout, out.stderr)
        self.assertIn("no-such-compiler-here", out.stdout)
        self.assertIn("build-essential", out.stdout)

    def test_bad_settings_are_refused_with_the_reason(self):
        with self.assertRaises(ValueError) as raised:
            _native.configure("max_split_size_mb:lots", 1 << 30)
        self.assertIn("max_split_size_mb", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
