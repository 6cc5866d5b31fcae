"""The data modules: real data loaded offline, the right shapes, splits and baselines, clear errors."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lltm_train.data import (AddingDataModule, CO2DataModule, CopyDataModule, JapaneseVowelsDataModule,
                             SequentialMNISTDataModule, ShakespeareDataModule, TextDataModule)


def first_batch(dm, split="train"):
    dm.setup("fit")
    return next(iter(getattr(dm, f"{split}_dataloader")()))


def test_shakespeare_is_the_complete_works_at_character_level():
    dm = ShakespeareDataModule(seq_len=50, batch_size=4)
    dm.setup("fit")
    assert len(dm.files) == 42 and len(dm.vocab) == 84 and dm.task.kind == "tokens" and dm.task.input_size == 84
    x, lengths, y = next(iter(dm.train_dataloader()))
    assert lengths is None and x.shape == y.shape == (4, 50) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    total = sum(len(s) * 50 for s in (dm.train_set, dm.val_set, dm.test_set))
    assert 5_000_000 < total <= 5_057_198 + 41 * 2
    assert "ROMEO" in dm.decode(dm.train_set.tokens[:2_000_000].tolist()) or "Romeo" in dm.decode(dm.train_set.tokens.tolist())


def test_text_file_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "book.txt").write_text("abcdefghij" * 300 + "é", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    dm = TextDataModule(path="book.txt", seq_len=16, batch_size=2)
    x, _, y = first_batch(dm)
    assert dm.vocab == list("abcdefghij") + ["é"] and x.shape == (2, 16)
    assert dm.decode(dm.encode("jé")) == "jé"


def test_text_token_ids_index_the_sorted_characters(tmp_path):
    """Each character's id is its rank among the text's distinct characters in code-point order (astral ones
    too), over every split."""
    rng = random.Random(0)
    alphabet = ["\n", " ", "A", "z", "\xe9", "\u4e2d", "\U0001f600"]
    text = "".join(rng.choice(alphabet) for _ in range(4000))
    (tmp_path / "mixed.txt").write_text(text, encoding="utf-8")
    dm = TextDataModule(path=str(tmp_path / "mixed.txt"), seq_len=8, batch_size=2)
    dm.setup("fit")
    assert dm.vocab == sorted(set(text))
    ranks = {c: k for k, c in enumerate(sorted(set(text)))}
    ids = torch.cat([dm.train_set.tokens, dm.test_set.tokens, dm.val_set.tokens])
    assert ids.tolist() == [ranks[c] for c in text]


def test_text_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such text file: .*missing.txt"):
        TextDataModule(path=str(tmp_path / "missing.txt"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 2000)
    with pytest.raises(ValueError, match="is not utf-8 text .* set dataset.encoding"):
        TextDataModule(path=str(tmp_path / "latin1.txt")).setup("fit")
    latin1 = TextDataModule(path=str(tmp_path / "latin1.txt"), seq_len=8, encoding="latin-1")
    latin1.setup("fit")
    assert latin1.vocab == [" ", "a", "c", "f", "\xe9"] and latin1.task.input_size == 5
    assert latin1.decode(latin1.train_set[0][0].tolist()) == "caf\xe9 caf"
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(ValueError, match="too few for seq_len=128"):
        TextDataModule(path=str(tmp_path / "short.txt")).setup("fit")
    with pytest.raises(ValueError, match="seq_len must be a positive integer, got 0"):
        TextDataModule(path=str(tmp_path / "short.txt"), seq_len=0)


def test_restored_vocabulary_must_match(tmp_path):
    (tmp_path / "a.txt").write_text("abc" * 1000)
    dm = TextDataModule(path=str(tmp_path / "a.txt"), seq_len=8)
    dm.load_state_dict({"vocab": list("abcd")})
    with pytest.raises(ValueError, match="different vocabulary"):
        dm.setup("fit")


def test_a_checkpoint_of_another_text_is_refused_and_a_moved_text_accepted(tmp_path):
    """The text's SHA-256 travels in the state: the same characters in another order (same vocabulary) were
    accepted, so a resume trained on other data silently; the same file under another path is the same text."""
    (tmp_path / "a.txt").write_text("abc" * 1000)
    dm = TextDataModule(path=str(tmp_path / "a.txt"), seq_len=8)
    dm.setup("fit")
    state = dm.state_dict()
    (tmp_path / "moved.txt").write_text("abc" * 1000)
    moved = TextDataModule(path=str(tmp_path / "moved.txt"), seq_len=8)
    moved.setup("fit")
    moved.load_state_dict(state)
    (tmp_path / "b.txt").write_text("cba" * 1000)
    other = TextDataModule(path=str(tmp_path / "b.txt"), seq_len=8)
    other.setup("fit")
    assert other.vocab == dm.vocab
    with pytest.raises(ValueError, match=r"trained on another text than .*b\.txt \(their SHA-256 differ\)"):
        other.load_state_dict(state)


@pytest.mark.parametrize("mode, shape", [("rows", (28, 28)), ("pixels", (784, 1))])
def test_sequential_mnist(mode, shape):
    dm = SequentialMNISTDataModule(mode=mode, batch_size=8)
    x, lengths, y = first_batch(dm, "val")
    assert lengths is None and x.shape == (8, *shape) and y.shape == (8,) and 0 <= x.min() and x.max() < 1
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (50000, 10000, 10000)
    permuted = SequentialMNISTDataModule(mode=mode, permute=True, batch_size=8)
    xp, _, yp = first_batch(permuted, "val")
    assert torch.equal(y, yp) and not torch.equal(x, xp)
    assert torch.allclose(x.flatten(1).sort(1).values, xp.flatten(1).sort(1).values)  # same pixels, reordered


def test_japanese_vowels_has_variable_lengths():
    dm = JapaneseVowelsDataModule(batch_size=400)
    dm.setup("fit")
    x, lengths, y = next(iter(dm.test_dataloader()))
    assert len(dm.test_set) == 370 and len(dm.train_set) + len(dm.val_set) == 270
    assert x.shape[2] == 12 and lengths.min() == 7 and lengths.max() == 29 and set(y.tolist()) == set(range(9))
    assert torch.all(x[lengths.argmin(), 7:] == 0)  # zero padding past the end


def test_co2_windows_are_finite_and_standardised():
    dm = CO2DataModule(context=52, horizon=4)
    x, _, y = first_batch(dm)
    assert x.shape[1:] == (52, 1) and y.shape[1:] == (4,)
    train = dm.train_set.tensors[0]
    assert torch.isfinite(train).all() and abs(float(train.mean())) < 0.5 and 10 < dm.task.scale < 30


def test_adding_problem_targets_and_baseline():
    dm = AddingDataModule(seq_len=20, train_size=2000, val_size=100)
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.shape == (2000, 20, 2) and torch.all(x[..., 1].sum(1) == 2)
    assert torch.allclose((x[..., 0] * x[..., 1]).sum(1, keepdim=True), y)
    assert abs(float(((y - 1) ** 2).mean()) - dm.task.baseline_loss) < 0.02  # predicting the mean: MSE 1/6


def test_copy_task_targets_and_baseline():
    dm = CopyDataModule(delay=12, length=3, train_size=50, val_size=10)
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.shape == y.shape == (50, 18)
    assert torch.equal(y[:, -3:], x[:, :3]) and torch.all(x[:, 14] == 9) and torch.all(y[:, :-3] == 0)
    assert dm.task.baseline_loss == pytest.approx(3 * math.log(8) / 18)


def test_generated_data_is_seeded():
    a, b = AddingDataModule(train_size=10, val_size=5, seed=3), AddingDataModule(train_size=10, val_size=5, seed=3)
    a.setup(), b.setup()
    assert torch.equal(a.train_set.tensors[0], b.train_set.tensors[0])


def test_non_finite_series_values_are_refused(tmp_path):
    from lltm_train.data.japanese_vowels import read_ts

    path = tmp_path / "bad.ts"
    path.write_text("@classLabel true a b\n@data\n1.0,2.0:0.5,NaN:a\n")
    with pytest.raises(ValueError, match=r"bad.ts:3 holds 1 non-finite values"):
        read_ts(path)


def test_token_windows_getitems_matches_getitem():
    from lltm_train.data.text import TokenWindows

    tokens = torch.randint(0, 50, (103,), dtype=torch.int32)
    windows = TokenWindows(tokens, 10)
    assert len(windows) == 10  # (103 - 1) // 10: the last window needs one more token for its target
    indices = [9, 0, 4, 4, 7]  # unsorted, repeated, and the last window
    batch = windows.__getitems__(indices)
    assert batch.lengths is None and batch.x.dtype == batch.y.dtype == torch.int64
    assert torch.equal(batch.x, torch.stack([windows[i][0] for i in indices]))
    assert torch.equal(batch.y, torch.stack([windows[i][1] for i in indices]))
    x, y = windows[9]
    assert torch.equal(x, tokens[90:100].long()) and torch.equal(y, tokens[91:101].long())
    assert len(TokenWindows(tokens[:10], 10)) == 0 and len(TokenWindows(tokens[:11], 10)) == 1


def test_text_loader_batches_are_the_windows(tmp_path):
    (tmp_path / "t.txt").write_text("".join(chr(97 + (i * 7) % 26) for i in range(3000)))
    dm = TextDataModule(path=str(tmp_path / "t.txt"), seq_len=12, batch_size=5)
    x, lengths, y = first_batch(dm, "val")  # not shuffled: windows 0..4 of the validation split
    assert lengths is None
    assert torch.equal(x, torch.stack([dm.val_set[i][0] for i in range(5)]))
    assert torch.equal(y, torch.stack([dm.val_set[i][1] for i in range(5)]))


@pytest.mark.parametrize("make", [
    lambda: AddingDataModule(seq_len=6, train_size=11, val_size=5, test_size=7),
    lambda: CopyDataModule(delay=4, length=2, train_size=11, val_size=5, test_size=7),
], ids=["adding", "copy"])
def test_synthetic_splits_have_their_sizes(make):
    dm = make()
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (11, 5, 7)
    assert not torch.equal(dm.val_set.tensors[0][:5], dm.test_set.tensors[0][:5])  # separate draws
    x, _, y = next(iter(dm.test_dataloader()))
    assert x.shape[0] == 7 and y.shape[0] == 7


def test_text_task_spec_encodes_and_decodes(tmp_path):
    text = "The quick brown fox jumps over the lazy dog. " * 40
    (tmp_path / "fox.txt").write_text(text)
    dm = TextDataModule(path=str(tmp_path / "fox.txt"), seq_len=16)
    dm.setup("fit")
    spec = dm.task
    assert spec.kind == "tokens" and spec.input_size == spec.output_size == len(set(text)) == len(dm.vocab)
    ids = spec.encode("lazy fox.")
    assert all(0 <= i < spec.input_size for i in ids) and len(ids) == 9
    assert spec.decode(ids) == "lazy fox."
    assert spec.decode(spec.encode(text)) == text
    assert spec.encode("Zq!") == spec.encode("q")  # characters outside the vocabulary are dropped
    assert spec.decode(dm.train_set[0][0].tolist()) == text[:16]


@pytest.mark.parametrize("block", [64, 5], ids=["one gather an epoch", "gathers of 5 batches"])
def test_device_token_batches_cut_the_same_windows_as_the_data_loader(block, monkeypatch):
    """The GPU path of the text data sets (run here on the CPU): the batches the training DataLoader gives
    over the same windows and order, each epoch a new permutation, drop_last, and DDP ranks take disjoint shares."""
    from lltm_train.data.resumable import ResumableLoader, ResumableSampler
    from lltm_train.data.text import DeviceTokenBatches, TokenWindows

    monkeypatch.setattr(DeviceTokenBatches, "BLOCK", block)

    windows = TokenWindows(torch.arange(1000, dtype=torch.int32), seq_len=10)  # 99 windows, all different
    batches = DeviceTokenBatches(windows, 8, torch.device("cpu"), ResumableSampler(windows, 8, seed=3))
    loader = ResumableLoader(windows, batch_size=8, sampler=ResumableSampler(windows, 8, seed=3), drop_last=True,
                             collate_fn=lambda b: b)
    assert len(batches) == len(loader) == 12
    for _ in range(2):  # two epochs
        epoch, expected = list(batches), list(loader)
        assert len(epoch) == 12 and all(b.x.shape == b.y.shape == (8, 10) and b.lengths is None for b in epoch)
        assert all(torch.equal(b.x, e.x) and torch.equal(b.y, e.y) for b, e in zip(epoch, expected))
        assert all(torch.equal(b.y[:, :-1], b.x[:, 1:]) and torch.equal(b.x[:, 0] % 10, torch.zeros(8, dtype=torch.long))
                   for b in epoch)  # whole windows of the stream, y one step ahead
        assert len({int(x[0]) for b in epoch for x in b.x}) == 96  # no window twice in an epoch
    assert not torch.equal(epoch[0].x, next(iter(DeviceTokenBatches(windows, 8, torch.device("cpu"),
                                                                        ResumableSampler(windows, 8, seed=3)))).x)
    shares = [DeviceTokenBatches(windows, 8, torch.device("cpu"), ResumableSampler(windows, 8, seed=3, num_replicas=2,
                                                                                  rank=r)) for r in (0, 1)]
    firsts = [{tuple(x.tolist()) for b in share for x in b.x} for share in shares]
    assert len(shares[0]) == 6 and not firsts[0] & firsts[1]


@pytest.mark.parametrize("kind", ["loader", "device batches", "device batches, gathers of 5"])
@pytest.mark.parametrize("stop_at", [0, 5, 12, 17], ids=lambda k: f"stopped after {k} batches")
def test_a_training_loader_resumes_at_the_batch_it_stopped_at(kind, stop_at, monkeypatch):
    """A fresh loader given the saved position goes on with exactly the batches the first one would have
    given next, within an epoch, at its end and in the next (12 batches an epoch)."""
    from lltm_train.data.resumable import ResumableLoader, ResumableSampler
    from lltm_train.data.text import DeviceTokenBatches, TokenWindows

    if kind.endswith("gathers of 5"):
        monkeypatch.setattr(DeviceTokenBatches, "BLOCK", 5)

    windows = TokenWindows(torch.arange(1000, dtype=torch.int32), seq_len=10)

    def make():
        sampler = ResumableSampler(windows, 8, seed=11)
        if kind == "loader":
            return ResumableLoader(windows, batch_size=8, sampler=sampler, drop_last=True, collate_fn=lambda b: b)
        return DeviceTokenBatches(windows, 8, torch.device("cpu"), sampler)

    def epochs(loader, n):  # as Lightning drives it: set_epoch, then iterate; no call after the last batch
        out = []
        for _ in range(n):
            out += [b.x for _, b in zip(range(len(loader)), loader)]
        return out

    whole = epochs(make(), 3)
    first = make()
    taken = []
    iterator = iter(first)
    for _ in range(min(stop_at, 12)):
        taken.append(next(iterator).x)
    if stop_at >= 12:
        iterator = iter(first)
        taken += [next(iterator).x for _ in range(stop_at - 12)]
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b.x for _, b in zip(range(len(resumed) - state["batches"]), resumed)] + epochs(resumed, 1)
    assert len(taken) == stop_at
    assert all(torch.equal(a, b) for a, b in zip(taken + rest, whole)) and len(taken + rest) >= 24


def test_a_data_position_from_other_data_is_refused_or_restarts_the_epoch():
    from lltm_train.data.resumable import ResumableLoader, ResumableSampler
    from lltm_train.data.text import TokenWindows

    windows = TokenWindows(torch.arange(1000, dtype=torch.int32), seq_len=10)
    loader = ResumableLoader(windows, batch_size=8, sampler=ResumableSampler(windows, 8), drop_last=True)
    with pytest.raises(ValueError, match="not a data position"):
        loader.load_state_dict({"epoch": -1, "batches": 3})
    with pytest.warns(UserWarning, match="batches of 4 on 1 process.* over 99 samples each, this run has batches of 8 on 1 over 99"):
        loader.load_state_dict({"epoch": 2, "batches": 5, "batch_size": 4, "samples": 99})  # no data set size
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["batches"] == 0
    with pytest.warns(UserWarning, match="starts again"):  # 5 batches of 4 end inside a batch of 8
        loader.load_state_dict({"epoch": 2, "batches": 5, "batch_size": 4, "samples": 99, "dataset_size": 99})
    with pytest.warns(UserWarning, match="starts again"):  # another data set
        loader.load_state_dict({"epoch": 2, "batches": 4, "batch_size": 4, "samples": 50, "dataset_size": 50})


@pytest.mark.parametrize("saved_world, saved_batch, world, batch", [(1, 8, 2, 4), (1, 8, 2, 8), (2, 4, 1, 8), (2, 4, 3, 4)])
def test_a_data_position_carries_over_to_another_number_of_processes(saved_world, saved_batch, world, batch):
    """A run resumed on another number of processes (or batch size) trains on the rest of the epoch's order:
    every sample the saved run had not reached, none it had (batch boundaries permitting)."""
    from lltm_train.data.resumable import ResumableLoader, ResumableSampler

    data = list(range(240))
    def loaders(n, b):
        return [ResumableLoader(data, batch_size=b, sampler=ResumableSampler(data, b, seed=7, num_replicas=n, rank=r),
                                drop_last=True) for r in range(n)]

    saved = loaders(saved_world, saved_batch)
    trained = set()
    for loader in saved:
        it = iter(loader)
        for _ in range(6):
            trained.update(next(it).tolist())
    state = saved[0].state_dict()
    resumed = loaders(world, batch)
    for loader in resumed:
        loader.load_state_dict(state)
    rest = [i for loader in resumed for b in loader for i in b.tolist()]
    usable = 240 // (world * batch) * world * batch  # what whole batches of the new layout cover
    assert len(trained) == 6 * saved_world * saved_batch
    assert not trained & set(rest) and len(rest) == len(set(rest)) == usable - len(trained)


def test_token_streams_read_each_row_as_one_contiguous_stream():
    from lltm_train.data.text import TokenStreams

    tokens = torch.arange(1000, dtype=torch.int32)
    streams = TokenStreams(tokens, rows=4, seq_len=10)  # rows of 250 tokens: 24 windows of 10 (+1 target)
    assert len(streams) == 24
    rows = torch.cat([streams[k].x for k in range(len(streams))], 1)
    assert torch.equal(rows, torch.arange(1000).view(4, 250)[:, :240])
    assert all(torch.equal(streams[k].y, streams[k].x + 1) for k in range(len(streams)))
    with pytest.raises(IndexError):
        streams[24]
    shares = [TokenStreams(tokens, rows=2, seq_len=10, rank=r, world_size=2) for r in (0, 1)]
    assert torch.equal(torch.cat([s.streams for s in shares]), torch.arange(1000).view(4, 250))  # disjoint, all of it
    with pytest.raises(ValueError, match="too few for 8 streams of more than seq_len=200 tokens"):
        TokenStreams(tokens, rows=8, seq_len=200)


def test_a_stateful_text_module_gives_stream_windows_in_order(tmp_path):
    (tmp_path / "t.txt").write_text("".join(chr(97 + (i * 7) % 26) for i in range(6000)))
    dm = TextDataModule(str(tmp_path / "t.txt"), seq_len=16, batch_size=4, stateful=True)
    dm.setup("fit")
    assert dm.task.stateful
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        batches = list(loader)
        assert len(batches) == len(loader) > 1 and all(b.x.shape == (4, 16) for b in batches)
        assert all(torch.equal(b.x[:, 0], a.y[:, -1]) for a, b in zip(batches, batches[1:]))


def test_a_stateful_validation_reads_its_streams_from_the_first_window_every_pass(tmp_path):
    """Lightning's sanity check reads a few validation batches, and limit_val_batches a few each time: every pass
    must start at the first window (before the fix the next pass went on where the last one stopped, so the first
    validation read windows 2.. and each point of a curve other data)."""
    (tmp_path / "t.txt").write_text("".join(chr(97 + (i * 7) % 26) for i in range(6000)))
    dm = TextDataModule(str(tmp_path / "t.txt"), seq_len=16, batch_size=4, stateful=True)
    dm.setup("fit")
    for make in (dm.val_dataloader, dm.test_dataloader):
        loader = make()
        partial = [b for _, b in zip(range(2), loader)]  # a sanity check of 2 batches
        whole = list(loader)
        assert len(whole) == len(loader) > 2
        assert torch.equal(whole[0].x, partial[0].x) and torch.equal(whole[1].x, partial[1].x)
        assert torch.equal(whole[0].x, dm.val_set[0].x if make == dm.val_dataloader else dm.test_set[0].x)
