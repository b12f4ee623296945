//! A run's scalars as a TensorBoard event file, so that `tensorboard
//! --logdir <checkpoint-dir>` plots it while it trains.
//!
//! The file is a sequence of TFRecords, each an `Event` protocol buffer
//! framed as: its length (u64, little-endian), a masked CRC-32C of those 8
//! bytes, the bytes, and a masked CRC-32C of them. The three messages it
//! needs are written by hand below (a dozen fields); the `tboard` crate
//! would need `protoc` at build time.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use crc::{Crc, CRC_32_ISCSI};

/// The file's name: TensorBoard reads any file whose name holds `tfevents`.
pub const EVENTS_FILE: &str = "events.out.tfevents.workbook";

/// Appends events to a run's event file.
pub struct EventWriter {
    out: BufWriter<File>,
}

impl EventWriter {
    /// Starts the event file at `path` afresh (a resumed run rewrites what
    /// its kept steps logged, so the file never holds a step twice).
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut writer = Self { out: BufWriter::new(file) };
        let mut version = Message::default();
        version.double(1, wall_time());
        version.bytes(3, b"brain.Event:2");
        writer.write(&version.0)?;
        Ok(writer)
    }

    /// Writes the scalars `values` (tag, value) of step `step`; values that
    /// are not finite are left out.
    pub fn scalars(&mut self, step: usize, values: &[(impl AsRef<str>, f64)]) -> Result<()> {
        let mut summary = Message::default();
        for (tag, value) in values.iter().filter(|(_, v)| v.is_finite()) {
            let mut entry = Message::default();
            entry.bytes(1, tag.as_ref().as_bytes());
            entry.float(2, *value as f32);
            summary.bytes(1, &entry.0);
        }
        let mut event = Message::default();
        event.double(1, wall_time());
        event.varint(2, step as u64);
        event.bytes(5, &summary.0);
        self.write(&event.0)?;
        self.out.flush().context("cannot write the TensorBoard event file")
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.out.write_all(&record(data)).context("cannot write the TensorBoard event file")
    }
}

/// `data` framed as one TFRecord.
pub fn record(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// CRC-32C, its table built once, at compile time.
const CASTAGNOLI: Crc<u32> = Crc::<u32>::new(&CRC_32_ISCSI);

/// TFRecord's checksum: CRC-32C, rotated and offset so that a CRC of bytes
/// holding CRCs does not degenerate.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = CASTAGNOLI.checksum(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn wall_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A protocol buffer message being written, field by field.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn key(&mut self, field: u32, wire_type: u8) {
        self.raw_varint(u64::from(field) << 3 | u64::from(wire_type));
    }

    fn raw_varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn varint(&mut self, field: u32, value: u64) {
        self.key(field, 0);
        self.raw_varint(value);
    }

    fn double(&mut self, field: u32, value: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn bytes(&mut self, field: u32, value: &[u8]) {
        self.key(field, 2);
        self.raw_varint(value.len() as u64);
        self.0.extend_from_slice(value);
    }

    fn float(&mut self, field: u32, value: f32) {
        self.key(field, 5);
        self.0.extend_from_slice(&value.to_le_bytes());
    }
}
