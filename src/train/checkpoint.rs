//! Checkpoints on disk: the format, and writing it so that a crash never costs
//! the last good one. What goes into a checkpoint is exercise 11.
//!
//! A checkpoint is a directory:
//!
//! ```text
//! step_000100/
//!   model.safetensors       parameters by their Hugging Face names
//!   optimizer.safetensors   AdamW's moments: exp_avg.<name>, exp_avg_sq.<name>
//!   trainer_state.json      step, configs, data position
//!   checksums.json          the CRC-32 of every other file, checked on every read
//!   config.json, generation_config.json, tokenizer*.json
//!                           the same model as a Hugging Face directory (see [`crate::hf`])
//! ```
//!
//! It is written into a temporary sibling directory, flushed to the disk, and
//! renamed into place only when complete; a rename within one filesystem is
//! atomic, so a reader sees either the old checkpoint or the new one, never
//! half of one, even after a power loss.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{bail, DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::tensor_file::{TensorFile, TensorFileReader, TensorSpec};
use super::{faults, AdamW, TrainConfig};
use crate::data::{DataConfig, SamplerState};
use crate::error::io_path;
use crate::model::{param_specs, GptConfig};

const MODEL_FILE: &str = "model.safetensors";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const STATE_FILE: &str = "trainer_state.json";
/// The CRC-32 of every other file, checked on every read. Checkpoints from
/// before it existed have none, and those from before it covered every file
/// list the tensor files only: what is not listed loads unchecked.
const CHECKSUM_FILE: &str = "checksums.json";
/// The files a checkpoint cannot do without.
const ESSENTIAL_FILES: [&str; 3] = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE];
const FORMAT_VERSION: u32 = 1;

/// Everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format_version: u32,
    /// Optimizer steps taken when the checkpoint was written.
    pub step: usize,
    /// AdamW's own step count (t in its bias corrections).
    pub optimizer_steps: u64,
    pub model: GptConfig,
    pub train: TrainConfig,
    /// Which data, and where its stream stood, so a resumed run reads on from there.
    pub data: Option<DataPosition>,
    /// How the run that wrote it split the work across ranks, in words
    /// ([`Train::layout`](super::Train::layout)); `None` when its trainer
    /// does not say (exercise 11's). A checkpoint holds whole tensors either
    /// way, so either trainer reads it.
    #[serde(default)]
    pub layout: Option<String>,
}

/// The data a run reads and how far it has read: the dataset, tokenizer and
/// seed (which fixes every epoch's shuffle) and the sampler's position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPosition {
    pub config: DataConfig,
    pub sampler: SamplerState,
    /// Windows at the end of the data held out for evaluation, never
    /// trained on: a resumed run must hold out as many.
    #[serde(default)]
    pub held_out: usize,
}

/// A checkpoint in memory.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub params: HashMap<String, Tensor>,
    pub optimizer: HashMap<String, Tensor>,
    pub state: TrainerState,
}

impl TrainerState {
    pub fn new(
        step: usize,
        optimizer_steps: u64,
        model: GptConfig,
        train: TrainConfig,
        data: Option<DataPosition>,
    ) -> Self {
        Self { format_version: FORMAT_VERSION, step, optimizer_steps, model, train, data, layout: None }
    }
}

impl Checkpoint {
    /// Writes the checkpoint to `dir`, replacing what is there only once the
    /// new one is complete. A write that fails removes what it staged.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let spec = |(name, t): (&String, &Tensor)| TensorSpec {
            name: name.clone(),
            shape: t.shape().clone(),
            dtype: t.dtype(),
        };
        let dtype = self.params.values().next().map_or(DType::F32, Tensor::dtype);
        let (params, optimizer) = (self.params.iter().map(spec), self.optimizer.iter().map(spec));
        let mut writer = CheckpointWriter::with_tensors(dir, params, optimizer, dtype)?;
        for (name, t) in &self.params {
            writer.put_param(name, t);
        }
        for (name, t) in &self.optimizer {
            writer.put_optimizer(name, t);
        }
        writer.finish(&self.state)
    }

    /// Whether `dir` holds every file of a checkpoint: a directory that lost
    /// one (or a stray `step_*` made by hand) is never taken for one.
    pub fn is_complete(dir: &Path) -> bool {
        Self::missing_files(dir).is_empty()
    }

    /// Whether `dir` is a directory (not a link to one) holding nothing but
    /// files a save writes, as a save or a deletion killed midway leaves it.
    /// A directory with anything else in it is someone else's.
    pub fn holds_only_saved_files(dir: &Path) -> bool {
        let saved = |name: &str| {
            [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, CHECKSUM_FILE].contains(&name)
                || crate::hf::MODEL_DIR_FILES.contains(&name)
        };
        let is_dir = fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
        is_dir
            && fs::read_dir(dir).is_ok_and(|entries| {
                entries.into_iter().all(|entry| {
                    entry.is_ok_and(|e| {
                        e.file_type().is_ok_and(|t| t.is_file()) && saved(&e.file_name().to_string_lossy())
                    })
                })
            })
    }

    /// Whether `dir` is a whole checkpoint that a save wrote, by its content:
    /// every file a checkpoint needs, each listed in its `checksums.json` and
    /// matching it, a state that reads, and nothing else.
    pub fn is_written_by_a_save(dir: &Path) -> bool {
        Self::holds_only_saved_files(dir)
            && Self::is_complete(dir)
            && Self::has_checksums(dir)
            && Self::verify(dir).is_ok_and(|unchecked| unchecked.is_empty())
    }

    /// The files a checkpoint cannot do without that `dir` lacks.
    pub fn missing_files(dir: &Path) -> Vec<&'static str> {
        ESSENTIAL_FILES.into_iter().filter(|file| !dir.join(file).is_file()).collect()
    }

    /// Fails unless every file of the checkpoint in `dir` is what was written
    /// (each file `checksums.json` lists matches its checksum) and its state
    /// reads. Returns the essential files it had no checksum for, which a
    /// checkpoint from an older workbook lacks, for the caller to warn of.
    pub fn verify(dir: &Path) -> Result<Vec<&'static str>> {
        let unchecked = verify_checksums(dir, None)?;
        read_state(dir)?;
        Ok(unchecked)
    }

    /// Whether `dir` has a `checksums.json`: without one, nothing in it can be
    /// told intact.
    pub fn has_checksums(dir: &Path) -> bool {
        dir.join(CHECKSUM_FILE).is_file()
    }

    /// Fails if a file that `dir`'s `checksums.json` lists is missing or not
    /// what was written; a directory without one passes.
    pub fn verify_listed_files(dir: &Path) -> Result<()> {
        verify_checksums(dir, None).map(|_| ())
    }

    /// Reads the checkpoint in `dir`, with errors that say what is wrong with it.
    pub fn read(dir: &Path) -> Result<Self> {
        Self::read_where(dir, |_| true)
    }

    /// The checkpoint in `dir` as [`read`](Self::read) gives it, but only the
    /// parameters `keep` names and their moments, read without the others:
    /// what a pipeline stage holds.
    pub fn read_where(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Self> {
        let (state, params) = Self::read_model_where(dir, &keep)?;
        verify_checksums(dir, Some(OPTIMIZER_FILE))?;
        let optimizer = load_tensors(dir, OPTIMIZER_FILE, |moment| AdamW::param_of_moment(moment).is_some_and(&keep))?;
        Ok(Self { params, optimizer, state })
    }

    /// The state alone (steps, configs, data position), checked.
    pub fn read_state(dir: &Path) -> Result<TrainerState> {
        read_state(dir)
    }

    /// The state and the parameters `keep` names, read without the others
    /// or the optimizer's state: what inference needs, or a rank's part.
    pub fn read_model_where(
        dir: &Path,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(TrainerState, HashMap<String, Tensor>)> {
        let state = read_state(dir)?;
        verify_checksums(dir, Some(MODEL_FILE))?;
        Ok((state, load_tensors(dir, MODEL_FILE, keep)?))
    }

    /// Fails unless the checkpoint was written for a model of shape `config`.
    pub fn ensure_fits(&self, config: &GptConfig) -> Result<()> {
        if &self.state.model == config {
            return Ok(());
        }
        let (saved, here) = (serde_json::to_value(&self.state.model), serde_json::to_value(config));
        let (Ok(serde_json::Value::Object(saved)), Ok(serde_json::Value::Object(here))) = (saved, here) else {
            bail!("the checkpoint was written for a different model");
        };
        let differ: Vec<String> = saved
            .iter()
            .filter(|(field, value)| here.get(*field) != Some(value))
            .map(|(field, value)| {
                let this_run = here.get(field).map_or("nothing".to_string(), ToString::to_string);
                format!("{field} {value} there, {this_run} here")
            })
            .collect();
        let advice = match differ.iter().all(|d| d.starts_with("vocab_size ")) {
            true => "the vocabulary follows the tokenizer: use the --tokenizer it was trained with",
            false => "use the model size (--model-size) it was trained with",
        };
        bail!("the checkpoint was written for a different model ({}): {advice}", differ.join("; "))
    }
}

/// A checkpoint written a tensor at a time: every tensor's place is fixed
/// when it is created, each is written whenever the writer has it, and
/// [`finish`](Self::finish) completes the checkpoint as
/// [`Checkpoint::write`] does (which writes through one). A sharded trainer
/// gathers and writes one piece of the model at a time, so no rank ever
/// holds the whole model and its optimizer state at once.
///
/// A write that fails is reported by `finish`, not where it happened, so
/// that a rank whose write failed still takes part in every collective the
/// other ranks make while it saves. It writes into a temporary sibling of
/// the checkpoint's directory, which replaces the directory only once
/// complete; dropped unfinished (an error on the way), it removes what it
/// staged.
pub struct CheckpointWriter {
    dir: PathBuf,
    staging: PathBuf,
    /// The write's number, for the fault injection of tests.
    number: u64,
    model: Option<TensorFile>,
    optimizer: Option<TensorFile>,
    /// The parameters' dtype, which the Hugging Face config records.
    dtype: DType,
    /// The model the tensors are of, when created from a config.
    config: Option<GptConfig>,
    /// The first write that failed.
    failed: Option<candle_core::Error>,
    finished: bool,
}

impl CheckpointWriter {
    /// Starts the checkpoint in `dir` of a model of shape `config`: every
    /// parameter (by its Hugging Face name, in `dtype`) and, with `moments`,
    /// AdamW's two moments of each (f32, by AdamW's names).
    pub fn create(dir: &Path, config: &GptConfig, dtype: DType, moments: bool) -> Result<Self> {
        let specs = param_specs(config);
        let params = specs.iter().map(|s| TensorSpec { name: s.name.clone(), shape: s.shape.clone(), dtype });
        let optimizer = specs.iter().filter(|_| moments).flat_map(|s| {
            let shape = s.shape.clone();
            AdamW::moment_names(&s.name).map(move |name| TensorSpec { name, shape: shape.clone(), dtype: DType::F32 })
        });
        let mut writer = Self::with_tensors(dir, params, optimizer, dtype)?;
        writer.config = Some(config.clone());
        Ok(writer)
    }

    fn with_tensors(
        dir: &Path,
        params: impl IntoIterator<Item = TensorSpec>,
        optimizer: impl IntoIterator<Item = TensorSpec>,
        dtype: DType,
    ) -> Result<Self> {
        let number = faults::checkpoint_write_begins()?;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| io_path("create", &parent, e))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // Unique per writer, even for two threads of one process (ranks as threads).
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let writer = WRITES.fetch_add(1, Ordering::Relaxed);
        let staging = parent.join(format!(".{name}.partial-{}-{writer}", std::process::id()));
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(|e| io_path("remove", &staging, e))?;
        }
        fs::create_dir(&staging).map_err(|e| io_path("create", &staging, e))?;
        let mut writer = Self {
            dir: dir.to_path_buf(),
            staging,
            number,
            model: None,
            optimizer: None,
            dtype,
            config: None,
            failed: None,
            finished: false,
        };
        // Dropped on an error here, the writer removes the staging directory.
        writer.model = Some(TensorFile::create(&writer.staging.join(MODEL_FILE), params)?);
        writer.optimizer = Some(TensorFile::create(&writer.staging.join(OPTIMIZER_FILE), optimizer)?);
        Ok(writer)
    }

    /// Writes the parameter `name` (its Hugging Face name); a failure is
    /// [`finish`](Self::finish)'s error.
    pub fn put_param(&mut self, name: &str, t: &Tensor) {
        let written = self.model.as_mut().expect("open until finished").put(name, t);
        self.failed = self.failed.take().or(written.err());
    }

    /// Writes the optimizer tensor `name` (AdamW's name of a moment); a
    /// failure is [`finish`](Self::finish)'s error.
    pub fn put_optimizer(&mut self, name: &str, t: &Tensor) {
        let written = self.optimizer.as_mut().expect("open until finished").put(name, t);
        self.failed = self.failed.take().or(written.err());
    }

    /// Completes the checkpoint with `state` once every tensor is written,
    /// and moves it into place.
    pub fn finish(mut self, state: &TrainerState) -> Result<()> {
        if let Some(failed) = self.failed.take() {
            return Err(failed);
        }
        if let Some(config) = self.config.as_ref().filter(|config| **config != state.model) {
            bail!("the checkpoint's tensors are of {config:?}, its state of {:?}", state.model);
        }
        self.write_rest(state)?;
        replace_dir(&self.staging, &self.dir)?;
        self.finished = true;
        Ok(())
    }

    /// The tensor files closed and every other file of the checkpoint
    /// written, each flushed to the disk.
    fn write_rest(&mut self, state: &TrainerState) -> Result<()> {
        let staging = &self.staging;
        self.model.take().expect("open until finished").finish()?;
        faults::disk_full_check(self.number).map_err(|e| io_path("write", &staging.join(OPTIMIZER_FILE), e))?;
        self.optimizer.take().expect("open until finished").finish()?;
        let tokenizer = state.data.as_ref().map(|d| d.config.tokenizer);
        crate::hf::write_model_files(staging, &state.model, self.dtype, tokenizer)?;
        let json = serde_json::to_string_pretty(state).map_err(candle_core::Error::wrap)?;
        fs::write(staging.join(STATE_FILE), json).map_err(|e| io_path("write", staging, e))?;
        let mut checksums = BTreeMap::new();
        for entry in fs::read_dir(staging).map_err(|e| io_path("list", staging, e))? {
            let path = entry.map_err(|e| io_path("list", staging, e))?.path();
            checksums.insert(file_name(&path), crc32_of(&path)?);
            sync_file(&path)?;
        }
        let json = serde_json::to_string_pretty(&checksums).map_err(candle_core::Error::wrap)?;
        fs::write(staging.join(CHECKSUM_FILE), json).map_err(|e| io_path("write", staging, e))?;
        sync_file(&staging.join(CHECKSUM_FILE))?;
        sync_file(staging)
    }
}

impl Drop for CheckpointWriter {
    /// On a full disk, what was staged would make the next save fail too.
    fn drop(&mut self) {
        if !self.finished {
            let _ = fs::remove_dir_all(&self.staging);
        }
    }
}

/// The CRC-32 of the file at `path`, read a piece at a time.
fn crc32_of(path: &Path) -> Result<u32> {
    let mut file = fs::File::open(path).map_err(|e| io_path("open", path, e))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buffer).map_err(|e| io_path("read", path, e))?;
        if n == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buffer[..n]);
    }
}

/// The tensors of `dir/file` that `keep` names, or an error that says the file is damaged.
fn load_tensors(dir: &Path, file: &str, keep: impl Fn(&str) -> bool) -> Result<HashMap<String, Tensor>> {
    let path = dir.join(file);
    let read = || -> Result<HashMap<String, Tensor>> {
        let mut reader = TensorFileReader::open(&path)?;
        let kept: Vec<String> = reader.names().filter(|name| keep(name)).map(String::from).collect();
        kept.into_iter().map(|name| Ok((name.clone(), reader.read(&name, &Device::Cpu)?))).collect()
    };
    match read() {
        Ok(tensors) => Ok(tensors),
        Err(e) => bail!("{} is corrupt or missing ({e}); resume from an earlier checkpoint", path.display()),
    }
}

/// The state of the checkpoint in `dir`, checked against its checksum.
fn read_state(dir: &Path) -> Result<TrainerState> {
    if !dir.join(STATE_FILE).exists() {
        bail!(
            "{} is not a checkpoint (no {STATE_FILE}): point --resume at a step_NNNNNN directory written by train",
            dir.display()
        );
    }
    verify_checksums(dir, Some(STATE_FILE))?;
    let text = fs::read_to_string(dir.join(STATE_FILE)).map_err(|e| io_path("read", dir, e))?;
    let state: TrainerState = match serde_json::from_str(&text) {
        Ok(state) => state,
        Err(e) => bail!("{} is corrupt: {e}; resume from an earlier checkpoint", dir.join(STATE_FILE).display()),
    };
    if state.format_version != FORMAT_VERSION {
        bail!(
            "{} has format version {}, this workbook reads version {FORMAT_VERSION}",
            dir.display(),
            state.format_version
        );
    }
    Ok(state)
}

/// Fails if a file of the checkpoint in `dir` that `checksums.json` lists
/// (only `only`, when given) is missing or not what was written. Returns the
/// essential files (of those asked for) that it lists no checksum for.
fn verify_checksums(dir: &Path, only: Option<&str>) -> Result<Vec<&'static str>> {
    let asked = |file: &str| only.is_none_or(|only| only == file);
    let unlisted = |listed: &BTreeMap<String, u32>| {
        ESSENTIAL_FILES.into_iter().filter(|&f| asked(f) && !listed.contains_key(f)).collect()
    };
    let path = dir.join(CHECKSUM_FILE);
    let Ok(text) = fs::read_to_string(&path) else { return Ok(unlisted(&BTreeMap::new())) };
    let expected: BTreeMap<String, u32> = match serde_json::from_str(&text) {
        Ok(expected) => expected,
        Err(e) => bail!("{} is corrupt: {e}; resume from an earlier checkpoint", path.display()),
    };
    for (file, want) in expected.iter().filter(|(file, _)| asked(file)) {
        // Names of files beside it, never a path elsewhere.
        if file.is_empty() || file.contains(['/', '\\']) || file.starts_with('.') {
            bail!("{} is corrupt: it lists `{file}`, which is not a file of a checkpoint", path.display());
        }
        let listed = dir.join(file);
        if !listed.is_file() {
            bail!(
                "{} is missing (it is listed in {CHECKSUM_FILE}); resume from an earlier checkpoint",
                listed.display()
            );
        }
        if crc32_of(&listed)? != *want {
            bail!(
                "{} is corrupt: its checksum does not match the one in {CHECKSUM_FILE} (a bit changed on disk, a \
                 copy was cut short, or the file was edited); resume from an earlier checkpoint",
                listed.display()
            );
        }
    }
    Ok(unlisted(&expected))
}

/// The last component of `path`, as text.
fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Flushes the file or directory at `path` to the disk, so that a power loss
/// after the rename that follows cannot leave a checkpoint whose files are
/// empty (a rename can reach the disk before the data it names).
fn sync_file(path: &Path) -> Result<()> {
    // Directories open only on Unix; elsewhere their entries are not synced.
    if path.is_dir() && !cfg!(unix) {
        return Ok(());
    }
    fs::File::open(path).and_then(|f| f.sync_all()).map_err(|e| io_path("flush to disk", path, e))
}

/// Moves the complete `staging` directory to `dir`; an existing `dir` is kept
/// aside until the new one is in place. Only a checkpoint, or an empty
/// directory, is replaced: a `dir` that holds other things and none of a
/// checkpoint's files is someone else's, and the save fails rather than
/// delete it.
fn replace_dir(staging: &Path, dir: &Path) -> Result<()> {
    let old = staging.with_extension("old");
    let had_old = dir.exists();
    let replaceable = dir.is_dir()
        && (ESSENTIAL_FILES.iter().any(|file| dir.join(file).exists())
            || fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none()));
    if had_old && !replaceable {
        bail!(
            "{} is in the way and is not a checkpoint (it holds none of {}): move it elsewhere; a save replaces \
             only an earlier checkpoint",
            dir.display(),
            ESSENTIAL_FILES.join(", ")
        );
    }
    if had_old {
        fs::rename(dir, &old).map_err(|e| io_path("move aside", dir, e))?;
    }
    fs::rename(staging, dir).map_err(|e| io_path("move into place", dir, e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_file(parent)?;
    }
    if had_old {
        fs::remove_dir_all(&old).map_err(|e| io_path("remove", &old, e))?;
    }
    Ok(())
}
