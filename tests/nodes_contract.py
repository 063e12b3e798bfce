"""torchdata's own save/load contract check, run on our nodes by tests/test_nodes_contract.py."""

# `run_test_save_load_state` below is copied unchanged from meta-pytorch/data (torchdata),
# test/nodes/utils.py at commit e640e6fc91792e1c92cdabb603ee5be63919934a; only the imports it uses are kept.
# Its header and torchdata's licence follow.
#
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.
#
# BSD 3-Clause License
#
# Copyright (c) 2021-present, Facebook, Inc.
# All rights reserved.
#
# Redistribution and use in source and binary forms, with or without
# modification, are permitted provided that the following conditions are met:
#
# * Redistributions of source code must retain the above copyright notice, this
#   list of conditions and the following disclaimer.
#
# * Redistributions in binary form must reproduce the above copyright notice,
#   this list of conditions and the following disclaimer in the documentation
#   and/or other materials provided with the distribution.
#
# * Neither the name of the copyright holder nor the names of its
#   contributors may be used to endorse or promote products derived from
#   this software without specific prior written permission.
#
# THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
# AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
# IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
# DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
# FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
# DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
# SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
# CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
# OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
# OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

import dataclasses

import numpy as np
import torch
from torchdata.nodes.base_node import BaseNode
from torchdata.nodes.loader import Loader


def run_test_save_load_state(test, node: BaseNode, midpoint: int):
    ##############################
    # Generate initial, midpoint, and end state_dict's
    x = Loader(node)

    initial_state_dict = x.state_dict()
    it = iter(x)
    results = []
    for _ in range(midpoint):
        results.append(next(it))
    state_dict = x.state_dict()
    for val in it:
        results.append(val)

    state_dict_0_end = x.state_dict()

    # store epoch 1's results
    it = iter(x)
    results_1 = []
    for _ in range(midpoint):
        results_1.append(next(it))
    state_dict_1 = x.state_dict()
    for val in it:
        results_1.append(val)

    ##############################
    # Test restoring from midpoint
    x.load_state_dict(state_dict)
    results_after = list(x)
    test.assertEqual(results_after, results[midpoint:])

    # Test for second epoch after resume
    results_after_1 = list(x)
    test.assertEqual(results_after_1, results_1)

    ##############################
    # Test restoring from midpoint of epoch 1
    x.load_state_dict(state_dict_1)
    results_after_2 = list(x)
    test.assertEqual(results_after_2, results_1[midpoint:])

    ##############################
    # Test initialize from beginning after resume
    x.load_state_dict(initial_state_dict)
    full_results = list(x)
    test.assertEqual(full_results, results)
    full_results_1 = list(x)
    test.assertEqual(full_results_1, results_1)

    ##############################
    # Test restoring from end-of-epoch 0
    x = Loader(node, restart_on_stop_iteration=False)
    x.load_state_dict(state_dict_0_end)
    results_after_dict_0_with_restart_false = list(x)
    test.assertEqual(results_after_dict_0_with_restart_false, [])

    ##############################
    # Test restoring from end of epoch 0 with restart_on_stop_iteration=True
    x = Loader(node)
    x.load_state_dict(state_dict_0_end)
    results_after_dict_0 = list(x)
    test.assertEqual(results_after_dict_0, results_1)


# Ours (not torchdata's): the `test` argument our tests pass it.

def _plain(x: object) -> object:
    """A value ``==`` compares exactly: tensors and arrays as (dtype, shape, bytes), containers element-wise."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), x.numpy().tobytes())
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return (type(x).__name__, [_plain(v) for v in x])
    if dataclasses.is_dataclass(x):
        return (type(x).__name__, {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


class Exact:
    """The ``test`` argument torchdata passes (its TestCase): ``assertEqual`` on batches of tensors and arrays."""

    def assertEqual(self, first: object, second: object) -> None:  # noqa: N802 (TestCase's name)
        assert _plain(first) == _plain(second)
