//! Ungraded checks of the data pipeline (`workbook::data`): tokenizers, token
//! files, datasets, the distributed sampler and the bundled sample. They pass
//! whatever state the exercises are in.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use workbook::data::{
    encode_documents, DataConfig, Dataset, DatasetKind, DistributedSampler, SamplerState, TokenFile, Tokenizer,
    SAMPLE_PATH,
};

use crate::support::repository_root;

/// A folder of its own under the system temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("workbook-data-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sample_path() -> PathBuf {
    repository_root().join(SAMPLE_PATH)
}

/// The first `n` stories of the bundled sample: enough text to exercise
/// everything, little enough for GPT-2's BPE in a debug build.
fn first_stories(n: usize) -> String {
    let sample =
        fs::read_to_string(sample_path()).expect("the bundled sample; restore it with `git checkout datasets`");
    let stories: Vec<&str> = sample.split_inclusive("\n<|endoftext|>\n").take(n).collect();
    assert_eq!(stories.len(), n, "the bundled sample holds fewer than {n} stories");
    stories.concat()
}

fn bytes_of(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

// ---------------------------------------------------------------------------
// Tokenizers

const TRICKY: &str = "Héllo, wörld! naïve café 🦀 — 日本語\n\ttabs  and  spaces<|endoftext|>Once upon a time.";

#[test]
fn bytes_tokenizer_round_trips_unicode_and_the_eot_marker() {
    let t = Tokenizer::Bytes;
    let ids = t.encode(TRICKY);
    assert_eq!(ids.iter().filter(|&&id| id == 256).count(), 1, "<|endoftext|> should become the single id 256");
    assert!(ids.iter().all(|&id| id < 257));
    assert_eq!(ids.len(), TRICKY.len() - "<|endoftext|>".len() + 1);
    assert_eq!(t.decode(&ids), TRICKY);
}

#[test]
fn gpt2_tokenizer_round_trips_unicode_and_the_eot_marker() {
    let t = Tokenizer::Gpt2;
    let ids = t.encode(TRICKY);
    assert_eq!(ids.iter().filter(|&&id| id == 50256).count(), 1, "<|endoftext|> should become the single id 50256");
    assert!(ids.iter().all(|&id| id < 50257));
    assert_eq!(t.decode(&ids), TRICKY);
}

/// Reference ids from OpenAI's Python `tiktoken` 0.14.0, built offline from the
/// same `r50k_base.tiktoken` file (whose SHA-256, 306cd27f…d930, is the one
/// `tiktoken` pins for r50k_base):
///
/// ```python
/// import tiktoken
/// from tiktoken.load import load_tiktoken_bpe
/// from tiktoken_ext.openai_public import r50k_pat_str
/// ranks = load_tiktoken_bpe("r50k_base.tiktoken", expected_hash="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930")
/// enc = tiktoken.Encoding("r50k_base", pat_str=r50k_pat_str, mergeable_ranks=ranks,
///                         special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
/// enc.encode(text, allowed_special="all")
/// ```
#[test]
fn gpt2_ids_match_tiktoken() {
    let cases: [(&str, &[u32]); 3] = [
        ("Hello world", &[15496, 995]),
        (
            "Once upon a time, there was a little girl named Lily. She loved to play outside.<|endoftext|>",
            &[
                7454, 2402, 257, 640, 11, 612, 373, 257, 1310, 2576, 3706, 20037, 13, 1375, 6151, 284, 711, 2354, 13,
                50256,
            ],
        ),
        ("naïve café 🦀 — 日本語", &[2616, 38776, 40304, 12520, 99, 222, 851, 10545, 245, 98, 17312, 105, 45739, 252]),
    ];
    for (text, want) in cases {
        assert_eq!(Tokenizer::Gpt2.encode(text), want, "GPT-2 ids of {text:?}");
    }
}

#[test]
fn tokenizers_report_their_vocabulary_and_eot() {
    assert_eq!((Tokenizer::Gpt2.vocab_size(), Tokenizer::Gpt2.eot()), (50257, 50256));
    assert_eq!((Tokenizer::Bytes.vocab_size(), Tokenizer::Bytes.eot()), (257, 256));
    assert_eq!(Tokenizer::Gpt2.decode(&[50256]), "<|endoftext|>");
    assert_eq!(Tokenizer::Bytes.decode(&[256]), "<|endoftext|>");
}

#[test]
fn tokenizers_parse_from_their_names() {
    for t in Tokenizer::ALL {
        assert_eq!(t.name().parse::<Tokenizer>().unwrap(), t);
    }
    let err = "sentencepiece".parse::<Tokenizer>().unwrap_err().to_string();
    assert!(
        err.contains("unknown tokenizer `sentencepiece`") && err.contains("gpt2") && err.contains("bytes"),
        "{err}"
    );
}

#[test]
fn decoding_a_cut_character_is_lossy_not_an_error() {
    // "é" is two bytes; a window may end between them.
    let cut = &Tokenizer::Bytes.encode("café")[..4];
    assert_eq!(Tokenizer::Bytes.decode(cut), "caf\u{FFFD}");
    assert_eq!(Tokenizer::Bytes.decode(&[104, 105, 999]), "hi\u{FFFD}");
    assert_eq!(Tokenizer::Gpt2.decode(&[15496, 60000]), "Hello\u{FFFD}");
}

// ---------------------------------------------------------------------------
// Streaming tokenisation

/// Encodes `text` a chunk at a time and returns all ids.
fn encode_chunked(text: &str, tokenizer: Tokenizer, chunk_bytes: usize) -> Vec<u32> {
    let mut ids = Vec::new();
    encode_documents(text.as_bytes(), tokenizer, chunk_bytes, |chunk, _| {
        ids.extend_from_slice(chunk);
        Ok(())
    })
    .unwrap();
    ids
}

#[test]
fn documents_are_trimmed_and_each_ends_with_eot() {
    let text = "\nFirst story.\n\nSecond paragraph.\n<|endoftext|>\n  Next one.\n<|endoftext|>\n<|endoftext|>\n";
    let mut want = bytes_of("First story.\n\nSecond paragraph.");
    want.push(256);
    want.extend(bytes_of("Next one."));
    want.push(256); // and no second eot for the empty document
    assert_eq!(encode_chunked(text, Tokenizer::Bytes, 1 << 20), want);
}

#[test]
fn text_without_markers_is_one_stream() {
    let text = "An article.\n\nIts second paragraph.\n\nAnother article, with no marker between.\n";
    assert_eq!(encode_chunked(text, Tokenizer::Bytes, 1 << 20), bytes_of(text.trim()));
}

#[test]
fn chunked_encoding_gives_the_same_ids_as_whole_documents() {
    let stories = first_stories(12);
    let web = "Headline: markets rise\n\nShares rose 3.5% on Tuesday , as  traders   bet...\n\n\n\
               \"We're optimistic,\" she said.\t(Reuters)\n\nSecond piece — ünïcödé and 日本語 text.\n";
    for tokenizer in Tokenizer::ALL {
        for text in [stories.as_str(), web] {
            let whole = encode_chunked(text, tokenizer, 1 << 20);
            for chunk_bytes in [1, 7, 64, 500] {
                assert_eq!(
                    encode_chunked(text, tokenizer, chunk_bytes),
                    whole,
                    "{tokenizer}: reading {chunk_bytes} bytes at a time changed the ids"
                );
            }
        }
    }
}

#[test]
fn chunked_gpt2_encoding_equals_encoding_each_document() {
    let text = first_stories(5);
    let mut want = Vec::new();
    for story in text.split("<|endoftext|>").map(str::trim).filter(|s| !s.is_empty()) {
        want.extend(Tokenizer::Gpt2.encode(story));
        want.push(50256);
    }
    assert_eq!(encode_chunked(&text, Tokenizer::Gpt2, 100), want);
}

// ---------------------------------------------------------------------------
// Token files

#[test]
fn token_file_is_written_once_then_reused() {
    let dir = Scratch::new("reuse");
    let text = dir.write("stories.txt", &first_stories(20));
    let mut reports = 0;
    let first = TokenFile::open_or_create(&text, Tokenizer::Bytes, Some(&mut |_| reports += 1)).unwrap();
    assert!(first.tokenised_now());
    assert!(reports > 0, "tokenising should report progress");
    assert_eq!(first.path(), dir.0.join("stories.txt.bytes.tokens"));
    let n = first.len();
    drop(first);

    let second = TokenFile::open_or_create(&text, Tokenizer::Bytes, None).unwrap();
    assert!(!second.tokenised_now(), "the second open should reuse the token file, not tokenise again");
    assert_eq!(second.len(), n);
    let mut ids = Vec::new();
    second.read_into(0..n, &mut ids);
    assert_eq!(ids, encode_chunked(&first_stories(20), Tokenizer::Bytes, 1 << 20));
    // Both vocabularies fit in 16 bits: 2 bytes per token after the 64-byte header.
    assert_eq!(fs::metadata(second.path()).unwrap().len(), 64 + 2 * n as u64);
}

#[test]
fn token_file_is_remade_when_the_text_changes() {
    let dir = Scratch::new("stale");
    let text = dir.write("stories.txt", "A short story.\n<|endoftext|>\n");
    let before = TokenFile::open_or_create(&text, Tokenizer::Gpt2, None).unwrap();
    assert!(before.tokenised_now());
    let old_len = before.len();
    drop(before);

    fs::write(&text, "A short story.\n<|endoftext|>\nAnd a second, longer one.\n<|endoftext|>\n").unwrap();
    let after = TokenFile::open_or_create(&text, Tokenizer::Gpt2, None).unwrap();
    assert!(after.tokenised_now(), "a changed text should be tokenised again");
    assert!(after.len() > old_len);
    assert!(!TokenFile::open_or_create(&text, Tokenizer::Gpt2, None).unwrap().tokenised_now());
}

#[test]
fn truncated_token_file_says_to_delete_it() {
    let dir = Scratch::new("truncated");
    let text = dir.write("stories.txt", &first_stories(3));
    let path = TokenFile::open_or_create(&text, Tokenizer::Bytes, None).unwrap().path().to_owned();
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    // The text is unchanged, so the header still matches it: the file is read, not re-made.
    let err = TokenFile::open_or_create(&text, Tokenizer::Bytes, None).unwrap_err().to_string();
    assert!(err.contains("corrupt") && err.contains("truncated") && err.contains("Delete it"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");

    fs::write(&path, &bytes[..10]).unwrap();
    let err = TokenFile::open(&path).unwrap_err().to_string();
    assert!(err.contains("shorter than its 64-byte header") && err.contains("Delete it"), "{err}");
}

#[test]
fn file_that_is_not_a_token_file_is_not_overwritten() {
    let dir = Scratch::new("magic");
    let text = dir.write("stories.txt", &first_stories(3));
    let imposter = dir.write("stories.txt.bytes.tokens", &"x".repeat(100));
    let err = TokenFile::open_or_create(&text, Tokenizer::Bytes, None).unwrap_err().to_string();
    assert!(err.contains("magic") && err.contains("Delete it"), "{err}");
    assert_eq!(fs::read_to_string(imposter).unwrap(), "x".repeat(100));
}

// ---------------------------------------------------------------------------
// Datasets

#[test]
fn windows_are_consecutive_slices_and_batches_are_b_by_t_u32() {
    let dir = Scratch::new("windows");
    let text = first_stories(10);
    let path = dir.write("stories.txt", &text);
    let data = Dataset::from_text(&path, Tokenizer::Bytes, 16, None).unwrap();
    let all = encode_chunked(&text, Tokenizer::Bytes, 1 << 20);
    assert_eq!(data.num_tokens(), all.len());
    assert_eq!(data.num_windows(), all.len() / 16);
    assert_eq!(data.window(3).unwrap(), all[48..64]);

    let batch = data.batch(&[5, 0, 5], &Device::Cpu).unwrap();
    assert_eq!(batch.dims(), &[3, 16]);
    assert_eq!(batch.dtype(), DType::U32);
    let rows = batch.to_vec2::<u32>().unwrap();
    assert_eq!(rows[0], all[80..96]);
    assert_eq!(rows[1], all[0..16]);
    assert_eq!(rows[2], rows[0]);
}

#[test]
fn batch_rejects_a_window_past_the_end() {
    let data = Dataset::dummy(4, 8, Tokenizer::Bytes, 0).unwrap();
    let err = data.batch(&[1, 4], &Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("window 4 does not exist") && err.contains("4 windows"), "{err}");
}

#[test]
fn dummy_dataset_is_seeded_random_tokens_in_the_vocabulary() {
    let a = Dataset::dummy(8, 32, Tokenizer::Gpt2, 7).unwrap();
    let b = Dataset::dummy(8, 32, Tokenizer::Gpt2, 7).unwrap();
    let c = Dataset::dummy(8, 32, Tokenizer::Gpt2, 8).unwrap();
    assert!(a.token_file().is_none());
    assert_eq!(a.num_windows(), 8);
    let ids = a.window(5).unwrap();
    assert!(ids.iter().all(|&id| id < 50257));
    assert_eq!(ids, b.window(5).unwrap(), "same seed, same tokens");
    assert_ne!(ids, c.window(5).unwrap(), "another seed, other tokens");
}

#[test]
fn open_dispatches_on_the_dataset_kind() {
    let dir = Scratch::new("open");
    let path = dir.write("stories.txt", &first_stories(4));
    let config =
        |kind| DataConfig { kind, path: Some(path.clone()), tokenizer: Tokenizer::Bytes, seq_len: 32, seed: 1 };
    let stories = Dataset::open(&config(DatasetKind::TinyStories), None).unwrap();
    assert_eq!(stories.token_file().unwrap().path(), dir.0.join("stories.txt.bytes.tokens"));
    let dummy = Dataset::open(&config(DatasetKind::Dummy), None).unwrap();
    assert!(dummy.token_file().is_none());
}

#[test]
fn too_little_text_for_one_window_is_an_error() {
    let dir = Scratch::new("short");
    let path = dir.write("tiny.txt", "Too short.");
    let err = Dataset::from_text(&path, Tokenizer::Bytes, 64, None).unwrap_err().to_string();
    assert!(err.contains("fewer than one window of seq_len 64") && err.contains("tiny.txt"), "{err}");
}

#[test]
fn missing_data_file_names_the_path_and_the_download_commands() {
    let path = Path::new("datasets/no-such-file.txt");
    let err = Dataset::from_text(path, Tokenizer::Gpt2, 64, None).unwrap_err().to_string();
    assert!(err.contains("`datasets/no-such-file.txt` not found"), "{err}");
    assert!(err.contains("--data-path") && err.contains("datasets/README.md, or use --dataset dummy"), "{err}");
}

#[test]
fn empty_data_file_names_the_path_and_the_download_commands() {
    let dir = Scratch::new("empty");
    let path = dir.write("empty.txt", "");
    let err = Dataset::from_text(&path, Tokenizer::Gpt2, 64, None).unwrap_err().to_string();
    assert!(err.contains("empty.txt` is empty") && err.contains("datasets/README.md"), "{err}");
}

#[test]
fn dataset_kinds_parse_and_unknown_ones_are_named() {
    for kind in DatasetKind::ALL {
        assert_eq!(kind.name().parse::<DatasetKind>().unwrap(), kind);
    }
    let err = "wikipedia".parse::<DatasetKind>().unwrap_err().to_string();
    // The first line: with RUST_BACKTRACE set, candle appends a backtrace.
    assert_eq!(err.lines().next().unwrap(), "unknown dataset `wikipedia`: choose dummy, tinystories or openwebtext");
}

// ---------------------------------------------------------------------------
// Distributed sampler

/// Every window rank `rank` of `world` reads in epoch `epoch`.
fn epoch_of(num_windows: usize, world: usize, rank: usize, seed: u64, epoch: u64) -> Vec<usize> {
    DistributedSampler::new(num_windows, world, rank, seed).unwrap().epoch_order(epoch)
}

#[test]
fn ranks_read_disjoint_windows_that_together_cover_every_kept_window() {
    let (n, world) = (103, 4);
    let shares: Vec<Vec<usize>> = (0..world).map(|r| epoch_of(n, world, r, 42, 0)).collect();
    for share in &shares {
        assert_eq!(share.len(), n / world, "every rank gets the same number of windows");
    }
    let union: BTreeSet<usize> = shares.iter().flatten().copied().collect();
    assert_eq!(union.len(), (n / world) * world, "the ranks' windows overlap");
    assert!(union.iter().all(|&w| w < n));
    let sampler = DistributedSampler::new(n, world, 0, 42).unwrap();
    assert_eq!(sampler.dropped_per_epoch(), 3);
}

#[test]
fn each_epoch_is_reshuffled() {
    let e0 = epoch_of(1000, 2, 1, 42, 0);
    let e1 = epoch_of(1000, 2, 1, 42, 1);
    assert_ne!(e0, e1);
    let mut sampler = DistributedSampler::new(1000, 2, 1, 42).unwrap();
    assert_eq!(sampler.next_batch(500), e0);
    assert_eq!(sampler.next_batch(500), e1, "after 500 windows, rank 1 of 2 should be in epoch 1");
    assert_eq!(sampler.epoch(), 1);
}

#[test]
fn same_seed_gives_the_same_order() {
    assert_eq!(epoch_of(500, 3, 2, 9, 4), epoch_of(500, 3, 2, 9, 4));
    assert_ne!(epoch_of(500, 3, 2, 9, 4), epoch_of(500, 3, 2, 10, 4));
}

#[test]
fn batches_stream_across_the_epoch_boundary() {
    let mut sampler = DistributedSampler::new(10, 1, 0, 3).unwrap();
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.extend(sampler.next_batch(3)); // 3 does not divide 10
    }
    let mut want = epoch_of(10, 1, 0, 3, 0);
    want.extend(&epoch_of(10, 1, 0, 3, 1)[..5]);
    assert_eq!(seen, want);
    assert_eq!(sampler.state(), SamplerState::at(1, 5, 1));
}

#[test]
fn restored_sampler_continues_exactly_where_it_stopped() {
    let mut original = DistributedSampler::new(37, 3, 1, 5).unwrap();
    for _ in 0..7 {
        original.next_batch(4);
    }
    let saved = serde_json::to_string(&original.state()).unwrap();
    let expected: Vec<Vec<usize>> = (0..10).map(|_| original.next_batch(4)).collect();

    let mut resumed = DistributedSampler::new(37, 3, 1, 5).unwrap();
    resumed.restore(serde_json::from_str(&saved).unwrap()).unwrap();
    let got: Vec<Vec<usize>> = (0..10).map(|_| resumed.next_batch(4)).collect();
    assert_eq!(got, expected);
}

#[test]
fn sampler_rejects_impossible_setups() {
    let err = DistributedSampler::new(10, 2, 2, 0).unwrap_err().to_string();
    assert!(err.contains("rank 2 is out of range for world_size 2"), "{err}");
    let err = DistributedSampler::new(3, 4, 0, 0).unwrap_err().to_string();
    assert!(err.contains("3 windows cannot be shared among 4 ranks"), "{err}");
    let mut sampler = DistributedSampler::new(10, 2, 0, 0).unwrap();
    let err = sampler.restore(SamplerState::at(0, 6, 2)).unwrap_err().to_string();
    assert!(err.contains("different dataset or seq_len"), "{err}");
}
/// W ranks that each read c windows have read the epoch's first c·W between
/// them; restored on W' ranks, the next global batch is the same windows.
#[test]
fn a_position_saved_by_some_ranks_restores_on_another_number_of_them() {
    let (windows, seed, batch) = (101, 7, 12);
    let mut two: Vec<DistributedSampler> =
        (0..2).map(|r| DistributedSampler::new(windows, 2, r, seed).unwrap()).collect();
    for _ in 0..3 {
        two.iter_mut().for_each(|s| drop(s.next_batch(batch / 2)));
    }
    let saved = two[0].state();
    let mut want: Vec<usize> = two.iter_mut().flat_map(|s| s.next_batch(batch / 2)).collect();
    want.sort_unstable();
    for world_size in [1, 3, 4] {
        let mut got: Vec<usize> = (0..world_size)
            .flat_map(|r| {
                let mut sampler = DistributedSampler::new(windows, world_size, r, seed).unwrap();
                sampler.restore(saved).unwrap();
                sampler.next_batch(batch / world_size)
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, want, "restored on {world_size} rank(s), the next global batch should be the same windows");
    }
}

#[test]
fn a_position_other_ranks_cannot_share_evenly_is_refused() {
    let mut sampler = DistributedSampler::new(100, 4, 0, 0).unwrap();
    let err = sampler.restore(SamplerState::at(0, 3, 2)).unwrap_err().to_string();
    assert!(err.contains("2 ranks had read 6 windows") && err.contains("4 ranks"), "{err}");
}

/// A checkpoint written before positions recorded their world size restores
/// its cursor as it is.
#[test]
fn a_position_without_its_world_size_restores_as_saved() {
    let mut sampler = DistributedSampler::new(100, 2, 1, 0).unwrap();
    sampler.restore(serde_json::from_str(r#"{"epoch": 1, "cursor": 9}"#).unwrap()).unwrap();
    assert_eq!(sampler.state(), SamplerState::at(1, 9, 2));
}
