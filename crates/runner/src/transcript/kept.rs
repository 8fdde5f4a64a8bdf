//! Transcripts: an attempt's `stdout` (the agent's whole event stream) and `stderr` files, kept
//! with the run and bounded by a cap.
//!
//! The cap ([`Cap`], [`CAP_VAR`], default [`DEFAULT_CAP`]) bounds what each file holds on disk:
//! its first quarter (the head: how the agent started) and its last three quarters (the tail:
//! how it ended, which is what the protocol readers need for the outcome) are kept, and what
//! lies between is cut. A cut is a hole punched in the file (`fallocate(PUNCH_HOLE)`): the file
//! keeps its length, so every offset into the stream stays the same (the offset journaled for
//! an adopted attempt, a `logs --follow` position), and the cut bytes take no disk and read as
//! zeros. The cut is recorded in `<file>.cut` (`<from> <to>`: the byte range cut) BEFORE the
//! hole is punched, so that a reader that finds zeros there already knows them as cut
//! ([`KeptReader`] skips them, and drops the two partial lines at the cut's edges).
//!
//! Who cuts: whatever writes the file and lives as long as the attempt, one writer each (two
//! would race on the record): the per-attempt supervisor or the run's shepherd for a supervised
//! attempt (checked a few times a second and once at the end), sortie's own reader for a direct
//! attempt (it writes what it reads from the pipes: [`Trimmer::write`]). A filesystem that
//! cannot punch holes keeps the transcript whole (the record is taken back).
//!
//! #10: a supervised attempt's stdout is never cut past what sortie has read AND journaled: its
//! usage checkpoints and tool calls are the ledger's, and a resume reads them again from the
//! file. sortie acknowledges its read offset in `<file>.read` ([`write_read`], after the
//! `AttemptRead` event that journals it is durable); the cutter cuts only below it. While sortie
//! is down (or behind) the file so grows past its cap, up to its hard bound ([`Cap::hard`]:
//! [`HARD_FACTOR`] times the cap, 64 MiB by default); past that the cutter cuts unread bytes all
//! the same, and its record says where the unread part of the cut starts (a third field):
//! `sortie logs` and `sortie status --task` name it, and the reader that jumps it warns that
//! what the agent said there (its usage, its tool calls) is not counted. stderr is not read by
//! the protocol reader: it is cut without waiting.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{FallocateFlags, fallocate};

use crate::layout::attempt::AttemptFiles;

/// The environment variable that sets the cap: bytes, with an optional `KiB`, `MiB` or `GiB`
/// suffix (`64MiB`); `0` keeps everything.
pub const CAP_VAR: &str = "SORTIE_TRANSCRIPT_CAP";
/// The default cap: 16 MiB per file (4 MiB of head, 12 MiB of tail).
pub const DEFAULT_CAP: u64 = 16 << 20;
/// The smallest cap that is not 0.
pub(super) const MIN_CAP: u64 = 4 * BLOCK;
/// Holes are punched in whole blocks.
const BLOCK: u64 = 4096;
/// How many times its cap a transcript sortie has not read may grow to (see the module doc).
pub const HARD_FACTOR: u64 = 4;
/// A cut grows by at least this much at a time (fewer punches and record writes), so a file
/// holds at most its cap plus this between two checks.
const STEP: u64 = 256 << 10;

/// A transcript's cap (see the module doc); 0 keeps everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// The most bytes a file keeps on disk.
    pub bytes: u64,
}

impl Default for Cap {
    fn default() -> Cap {
        Cap { bytes: DEFAULT_CAP }
    }
}

impl Cap {
    /// The cap of this process's environment ([`CAP_VAR`]); a value that does not parse is the
    /// default (and a warning).
    pub fn from_env() -> Cap {
        match std::env::var(CAP_VAR) {
            Ok(text) => Cap::parse(&text).unwrap_or_else(|e| {
                tracing::warn!("{CAP_VAR}: {e}; using the default cap");
                Cap::default()
            }),
            Err(_) => Cap::default(),
        }
    }

    /// Parses `64MiB`, `512KiB`, `1GiB`, `1048576`, `0`.
    pub fn parse(text: &str) -> Result<Cap, String> {
        let t = text.trim();
        let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("{text:?} is not a size (like 64MiB, or 0 for no cap)"))?;
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            other => return Err(format!("unknown unit {other:?} in {text:?}")),
        };
        let bytes = n
            .checked_mul(mult)
            .ok_or_else(|| format!("{text:?} is too large"))?;
        if bytes != 0 && bytes < MIN_CAP {
            return Err(format!(
                "{text:?} is below the smallest cap, {MIN_CAP} bytes"
            ));
        }
        Ok(Cap { bytes })
    }

    /// Whether nothing is ever cut.
    pub fn is_unbounded(self) -> bool {
        self.bytes == 0
    }

    /// The most bytes a stdout file keeps on disk while sortie has not read them: bytes sortie
    /// has not acknowledged are cut only once the file would keep more than this.
    pub fn hard(self) -> u64 {
        self.bytes.saturating_mul(HARD_FACTOR)
    }

    /// Where a cut starts: the head's end, a block boundary.
    fn head(self) -> u64 {
        (self.bytes / 4).div_ceil(BLOCK) * BLOCK
    }

    /// How much of the end is kept.
    fn tail(self) -> u64 {
        self.bytes.saturating_sub(self.head())
    }

    /// The cut a file of `len` bytes should have, if any: from the head's end to the last
    /// block boundary before the tail.
    fn cut_for(self, len: u64) -> Option<Cut> {
        if self.is_unbounded() {
            return None;
        }
        let from = self.head();
        let to = len.saturating_sub(self.tail()) / BLOCK * BLOCK;
        (to > from).then_some(Cut {
            from,
            to,
            unread: None,
        })
    }
}

/// A byte range cut from a transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Cut {
    /// The first byte cut.
    pub from: u64,
    /// The first byte kept after it.
    pub to: u64,
    /// #10: where its part that sortie had not read starts, when the file passed its hard
    /// bound (sortie down or behind): what the agent said in `unread..to` is not counted.
    pub unread: Option<u64>,
}

impl Cut {
    /// How many bytes were cut.
    pub fn bytes(&self) -> u64 {
        self.to - self.from
    }

    /// How many of them sortie had not read.
    pub fn unread_bytes(&self) -> u64 {
        self.unread.map_or(0, |u| self.to.saturating_sub(u))
    }
}

/// The record of `file`'s cut: `<file>.cut`.
pub fn cut_file(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".cut");
    file.with_file_name(name)
}

/// `file`'s cut, if it has one.
pub fn read_cut(file: &Path) -> Option<Cut> {
    let text = fs::read_to_string(cut_file(file)).ok()?;
    let mut it = text.split_ascii_whitespace().map(str::parse::<u64>);
    let (from, to) = (it.next()?.ok()?, it.next()?.ok()?);
    let unread = it
        .next()
        .and_then(Result::ok)
        .filter(|u| (from..to).contains(u));
    (to > from).then_some(Cut { from, to, unread })
}

/// The record of how far sortie has read and journaled `file`: `<file>.read`.
pub fn read_file(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".read");
    file.with_file_name(name)
}

/// Acknowledges that the journal holds what `file` (a supervised attempt's stdout) said up to
/// byte `offset` (see the module doc): renamed into place, not fsynced (a lost one only makes
/// the cutter wait longer).
pub fn write_read(file: &Path, offset: u64) -> io::Result<()> {
    let path = read_file(file);
    let tmp = path.with_extension("read.tmp");
    fs::write(&tmp, format!("{offset}\n"))?;
    fs::rename(&tmp, &path)
}

/// #10: whether acknowledging `offset` after `before` (the offset acknowledged, or journaled,
/// last) can let a cutter cut more: only when it reaches a later block ([`Trimmer`] reads an
/// acknowledgement in whole blocks, whatever the cap), so an agent's frequent usage
/// checkpoints cost a file write per 4 KiB of its stream, not one each; a small stream none.
pub fn ack_moves(before: u64, offset: u64) -> bool {
    offset / BLOCK > before / BLOCK
}

/// How far sortie acknowledged reading `file` (0: nothing yet).
fn acked(file: &Path) -> u64 {
    fs::read_to_string(read_file(file))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

fn write_cut(file: &Path, cut: Option<Cut>) -> io::Result<()> {
    let path = cut_file(file);
    let Some(cut) = cut else {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let tmp = path.with_extension("cut.tmp");
    let text = match cut.unread {
        Some(u) => format!("{} {} {u}\n", cut.from, cut.to),
        None => format!("{} {}\n", cut.from, cut.to),
    };
    fs::write(&tmp, text)?;
    fs::rename(&tmp, &path)
}

/// Keeps one transcript file under its cap: the only writer of its cut record.
#[derive(Debug)]
pub(crate) struct Trimmer {
    path: PathBuf,
    file: File,
    cap: Cap,
    cut: Option<Cut>,
    /// Set once the filesystem refused to punch a hole: the file is kept whole.
    unsupported: bool,
    /// The bytes written through [`Trimmer::write`].
    written: u64,
    /// #10: cut only below what sortie acknowledged reading (`<file>.read`), up to the hard
    /// bound: a supervised attempt's stdout.
    acked: bool,
}

impl Trimmer {
    /// For the file at `path`, which its writer already opened (the agent's own stdout or
    /// stderr, sortie following it): a stdout is cut only below what sortie acknowledged
    /// reading (see the module doc).
    pub(crate) fn open(path: &Path, cap: Cap) -> io::Result<Trimmer> {
        let file = OpenOptions::new().write(true).open(path)?;
        let mut t = Trimmer::with(path, file, cap);
        t.acked = AttemptFiles::is_stdout(path);
        Ok(t)
    }

    /// The trimmers of an attempt's `stdout` and `stderr` (`paths`), just created (truncated)
    /// for the agent's spawn, which hands over its own handles on them (`files`: nothing
    /// opened or duplicated again), under this process's cap; none when the cap is off. A file
    /// just truncated has no cut: its cut record is not looked for.
    pub(crate) fn for_attempt(paths: &AttemptFiles, files: [File; 2]) -> Vec<Trimmer> {
        let cap = Cap::from_env();
        if cap.is_unbounded() {
            return Vec::new();
        }
        let [out, err] = files;
        let mut stdout = Trimmer::fresh(&paths.stdout, out, cap);
        stdout.acked = true;
        vec![stdout, Trimmer::fresh(&paths.stderr, err, cap)]
    }

    /// Creates (truncates) the file at `path`, for a writer that writes through
    /// [`Trimmer::write`].
    pub(crate) fn create(path: &Path, cap: Cap) -> io::Result<Trimmer> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        let _ = write_cut(path, None);
        Ok(Trimmer::with(path, file, cap))
    }

    fn with(path: &Path, file: File, cap: Cap) -> Trimmer {
        let mut t = Trimmer::fresh(path, file, cap);
        t.cut = read_cut(path);
        t
    }

    /// A trimmer of a file that has no cut yet.
    fn fresh(path: &Path, file: File, cap: Cap) -> Trimmer {
        Trimmer {
            path: path.to_path_buf(),
            cut: None,
            file,
            cap,
            unsupported: false,
            written: 0,
            acked: false,
        }
    }

    /// Appends `bytes` (a writer through the trimmer) and cuts when the file outgrew its cap.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        self.trim(self.written, false)
    }

    /// Looks at the file's length and cuts when it outgrew its cap; `last` cuts even a small
    /// step (the file is complete).
    pub(crate) fn check(&mut self, last: bool) -> io::Result<()> {
        let len = self.file.metadata()?.len();
        self.trim(len, last)
    }

    fn trim(&mut self, len: u64, last: bool) -> io::Result<()> {
        if self.unsupported {
            return Ok(());
        }
        let Some(mut want) = self.cap.cut_for(len) else {
            return Ok(());
        };
        let done = self.cut.map_or(want.from, |c| c.to);
        let mut unread = self.cut.and_then(|c| c.unread);
        if self.acked {
            // #10: only what the journal holds, unless the file would keep more than its
            // hard bound.
            let read = acked(&self.path) / BLOCK * BLOCK;
            if want.to > read {
                let upto = read.max(done);
                if len - upto.saturating_sub(want.from) > self.cap.hard() {
                    unread.get_or_insert(upto);
                } else {
                    want.to = upto;
                }
            }
        }
        if want.to <= done || (!last && want.to - done < STEP) {
            return Ok(());
        }
        let cut = Cut {
            from: self.cut.map_or(want.from, |c| c.from),
            to: want.to,
            unread,
        };
        if cut.unread.is_some() && self.cut.and_then(|c| c.unread).is_none() {
            tracing::warn!(
                "{} outgrew its hard bound ({} bytes) before sortie read it: bytes {}..{} are \
                 cut unread",
                self.path.display(),
                self.cap.hard(),
                cut.unread.unwrap_or(cut.from),
                cut.to
            );
        }
        // The record first: a reader that finds zeros knows them as cut.
        write_cut(&self.path, Some(cut))?;
        let punched = fallocate(
            self.file.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            i64::try_from(done).unwrap_or(i64::MAX),
            i64::try_from(cut.to - done).unwrap_or(i64::MAX),
        );
        match punched {
            Ok(()) => {
                self.cut = Some(cut);
                Ok(())
            }
            Err(errno) => {
                // Nothing was cut: the record goes back to what is true.
                let _ = write_cut(&self.path, self.cut);
                self.unsupported = true;
                tracing::warn!(
                    "cannot cut {} to its cap ({errno}); it is kept whole",
                    self.path.display()
                );
                Ok(())
            }
        }
    }
}

/// #10: the attempt placed with the dir `dir` ended and the journal holds its end (its whole
/// stream was read and journaled): its stdout and stderr are cut to the cap at once, whatever
/// sortie had acknowledged (its cutter, the supervisor or the shepherd, is done with them, so
/// this is their one writer now). The end of an attempt that outgrew its cap while sortie was
/// down, and a Slurm job's files (which nothing cuts while the job runs on its node).
pub fn trim_ended(dir: &Path) {
    let cap = process_cap();
    if cap.is_unbounded() {
        return;
    }
    let files = AttemptFiles::of(dir);
    for path in [files.stdout, files.stderr] {
        let big = fs::metadata(&path).is_ok_and(|m| cap.cut_for(m.len()).is_some());
        if !big {
            continue;
        }
        let trimmed = OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|file| Trimmer::with(&path, file, cap).check(true));
        if let Err(e) = trimmed {
            tracing::debug!("cannot cut {} to its cap: {e}", path.display());
        }
    }
}

/// #10: how far sortie reads a supervised attempt's stdout on, with nothing held back, before
/// it acknowledges the offset without a usage checkpoint: an eighth of this process's cap
/// (at least a block; never when nothing is cut).
pub fn read_step() -> u64 {
    let cap = process_cap();
    if cap.is_unbounded() {
        u64::MAX
    } else {
        (cap.bytes / 8).max(BLOCK)
    }
}

/// This process's cap ([`Cap::from_env`]), read once.
fn process_cap() -> Cap {
    static CAP: std::sync::OnceLock<Cap> = std::sync::OnceLock::new();
    *CAP.get_or_init(Cap::from_env)
}

/// How often the supervisor looks at its attempt's files.
pub(crate) const CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// The supervisor's keeper of an attempt's files under the cap: a thread that looks at them
/// every [`CHECK_EVERY`] while the attempt runs, and once more at its end.
#[derive(Debug)]
pub(crate) struct Keeper {
    stop: std::sync::mpsc::Sender<()>,
    join: std::thread::JoinHandle<()>,
}

impl Keeper {
    /// Starts keeping `files` (already created by their writer) under `cap`; None when the cap
    /// is off or no file can be opened.
    pub(crate) fn start(files: &[PathBuf], cap: Cap) -> Option<Keeper> {
        if cap.is_unbounded() {
            return None;
        }
        let mut trimmers: Vec<Trimmer> = files
            .iter()
            .filter_map(|f| Trimmer::open(f, cap).ok())
            .collect();
        if trimmers.is_empty() {
            return None;
        }
        let (stop, rx) = std::sync::mpsc::channel();
        let join = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                loop {
                    let last = !matches!(
                        rx.recv_timeout(CHECK_EVERY),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                    );
                    for t in &mut trimmers {
                        let _ = t.check(last);
                    }
                    if last {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Keeper { stop, join })
    }

    /// The attempt ended: the files are cut one last time before this returns.
    pub(crate) fn finish(self) {
        let _ = self.stop.send(());
        let _ = self.join.join();
    }
}

/// What [`KeptReader::read`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// This many bytes of `buf`, in stream order.
    Bytes(usize),
    /// The stream jumps over this cut: the partial line before it and the one after it are not
    /// whole (a line consumer drops them).
    Cut(Cut),
    /// Nothing more for now (the end of the file so far, or no file yet).
    Idle,
}

/// Reads a transcript from an offset as it grows, jumping over its cut.
#[derive(Debug)]
pub struct KeptReader {
    path: PathBuf,
    file: Option<File>,
    pos: u64,
    cut: Option<Cut>,
    /// A cut met in the middle of the last read, reported next.
    pending: Option<Cut>,
}

impl KeptReader {
    /// Reads `path` from byte `from` (its start: 0).
    pub fn new(path: &Path, from: u64) -> KeptReader {
        KeptReader {
            path: path.to_path_buf(),
            file: None,
            pos: from,
            cut: None,
            pending: None,
        }
    }

    /// The offset reached: every byte before it was delivered or cut.
    pub fn offset(&self) -> u64 {
        self.pos
    }

    /// The cut seen so far.
    pub fn cut(&self) -> Option<Cut> {
        self.cut
    }

    /// Reads on into `buf`.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<Kept> {
        if let Some(cut) = self.pending.take() {
            return Ok(Kept::Cut(cut));
        }
        if self.file.is_none() {
            match File::open(&self.path) {
                Ok(mut f) => {
                    if self.pos > 0 {
                        f.seek(SeekFrom::Start(self.pos))?;
                    }
                    self.file = Some(f);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Kept::Idle),
                Err(e) => return Err(e),
            }
        }
        if let Some(cut) = self.cut
            && cut.from <= self.pos
            && self.pos < cut.to
        {
            self.jump(cut)?;
            return Ok(Kept::Cut(cut));
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(Kept::Idle);
        };
        let n = file.read(buf)?;
        if n == 0 {
            return Ok(Kept::Idle);
        }
        let end = self.pos + n as u64;
        if end > BLOCK {
            // Read after the bytes: a hole punched before them is recorded by now.
            self.cut = read_cut(&self.path).or(self.cut);
        }
        match self.cut {
            Some(cut) if cut.from < end && self.pos < cut.to => {
                let keep = usize::try_from(cut.from.saturating_sub(self.pos)).unwrap_or(0);
                self.jump(cut)?;
                if keep == 0 {
                    return Ok(Kept::Cut(cut));
                }
                self.pending = Some(cut);
                Ok(Kept::Bytes(keep))
            }
            _ => {
                self.pos = end;
                Ok(Kept::Bytes(n))
            }
        }
    }

    fn jump(&mut self, cut: Cut) -> io::Result<()> {
        self.pos = self.pos.max(cut.to);
        if let Some(f) = self.file.as_mut() {
            f.seek(SeekFrom::Start(self.pos))?;
        }
        Ok(())
    }
}

/// Drops the partial lines at a cut's edges from a byte stream (what `sortie logs` prints):
/// whole lines go out; the part of a line before a cut and the rest of the line after it are
/// dropped.
#[derive(Debug, Default)]
pub struct WholeLines {
    partial: Vec<u8>,
    skipping: bool,
}

impl WholeLines {
    /// Bytes of the stream: the whole lines among them go to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut impl Write) -> io::Result<()> {
        if self.skipping {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.skipping = false;
                    bytes = &bytes[i + 1..];
                }
                None => return Ok(()),
            }
        }
        match bytes.iter().rposition(|&b| b == b'\n') {
            Some(i) => {
                out.write_all(&self.partial)?;
                self.partial.clear();
                out.write_all(&bytes[..=i])?;
                self.partial.extend_from_slice(&bytes[i + 1..]);
            }
            None => self.partial.extend_from_slice(bytes),
        }
        Ok(())
    }

    /// A cut: the partial line goes, and so does the rest of the line after the cut.
    pub fn cut(&mut self) {
        self.partial.clear();
        self.skipping = true;
    }

    /// The stream ended: its last line, even without a newline.
    pub fn finish(&mut self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(&self.partial)?;
        self.partial.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(path: &Path) -> (Vec<u8>, Vec<Cut>) {
        let mut r = KeptReader::new(path, 0);
        let mut buf = vec![0u8; 1000];
        let (mut bytes, mut cuts) = (Vec::new(), Vec::new());
        let mut lines = WholeLines::default();
        loop {
            match r.read(&mut buf).unwrap() {
                Kept::Bytes(n) => lines.push(&buf[..n], &mut bytes).unwrap(),
                Kept::Cut(c) => {
                    lines.cut();
                    cuts.push(c);
                }
                Kept::Idle => break,
            }
        }
        lines.finish(&mut bytes).unwrap();
        (bytes, cuts)
    }

    #[test]
    fn caps_parse_with_units() {
        assert_eq!(Cap::parse("64MiB").unwrap().bytes, 64 << 20);
        assert_eq!(Cap::parse("512 KiB").unwrap().bytes, 512 << 10);
        assert_eq!(Cap::parse("0").unwrap().bytes, 0);
        assert_eq!(Cap::parse("1g").unwrap().bytes, 1 << 30);
        assert!(Cap::parse("12 parsecs").is_err());
        assert!(Cap::parse("100").is_err(), "below the smallest cap");
        assert!(Cap::parse("").is_err());
    }

    #[test]
    fn a_chatty_writer_keeps_its_head_and_tail_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let cap = Cap { bytes: 64 << 10 };
        let mut t = Trimmer::create(&path, cap).unwrap();
        let mut all = Vec::new();
        for i in 0..40_000 {
            let line = format!("{{\"line\":{i}}}\n");
            all.extend_from_slice(line.as_bytes());
            t.write(line.as_bytes()).unwrap();
        }
        t.check(true).unwrap();
        let len = fs::metadata(&path).unwrap().len();
        assert_eq!(
            len,
            all.len() as u64,
            "the file keeps its length: offsets hold"
        );
        let cut = read_cut(&path).expect("a cut is recorded");
        assert_eq!(cut.from, 16 << 10, "the head is a quarter of the cap");
        let tail = len - cut.to;
        assert!(
            (48 << 10..(48 << 10) + BLOCK).contains(&tail),
            "the tail kept: {tail}"
        );
        let (kept, cuts) = read_all(&path);
        assert_eq!(cuts, vec![cut]);
        let text = String::from_utf8(kept).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "{\"line\":0}");
        assert_eq!(*lines.last().unwrap(), "{\"line\":39999}");
        // Every line kept is whole: the partial lines at the cut's edges are dropped.
        for l in &lines {
            assert!(l.starts_with("{\"line\":") && l.ends_with('}'), "{l:?}");
        }
        assert!(text.len() as u64 <= cap.bytes + BLOCK);
        assert!(!text.contains('\0'));
    }

    /// Appends `n` bytes of lines to `path` (an agent writing its own stdout).
    fn append(path: &Path, n: usize) {
        let mut f = OpenOptions::new().append(true).open(path).unwrap();
        let line = b"0123456789abcdef0123456789abcdef0123456789abcdef012345678901234\n";
        for _ in 0..n / line.len() {
            f.write_all(line).unwrap();
        }
    }

    #[test]
    fn an_attempts_fresh_files_have_no_cut_whatever_a_stale_record_says() {
        let dir = tempfile::tempdir().unwrap();
        let stdout = dir.path().join(crate::layout::attempt::STDOUT_FILE);
        // A cut record left beside a file that the spawn truncates: it says nothing of it.
        fs::write(cut_file(&stdout), "4096 8192\n").unwrap();
        let create = |name: &str| {
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        let files = [
            create(crate::layout::attempt::STDOUT_FILE),
            create(crate::layout::attempt::STDERR_FILE),
        ];
        let trimmers = Trimmer::for_attempt(&AttemptFiles::inside(dir.path()), files);
        if Cap::from_env().is_unbounded() {
            assert!(trimmers.is_empty());
            return;
        }
        assert_eq!(trimmers.len(), 2);
        assert!(trimmers.iter().all(|t| t.cut.is_none()));
        assert!(trimmers[0].acked && !trimmers[1].acked);
    }

    #[test]
    fn a_followed_stdout_is_cut_only_below_what_sortie_acknowledged_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::layout::attempt::STDOUT_FILE);
        fs::write(&path, b"").unwrap();
        let cap = Cap { bytes: 64 << 10 };
        let mut t = Trimmer::open(&path, cap).unwrap();
        // sortie read nothing yet (down): past the cap, under the hard bound, nothing is cut.
        append(&path, 3 * (64 << 10));
        t.check(true).unwrap();
        assert_eq!(read_cut(&path), None, "nothing unread is cut");
        // sortie acknowledged 100 KiB: the cut stops at the block below it.
        write_read(&path, (100 << 10) + 17).unwrap();
        t.check(true).unwrap();
        let cut = read_cut(&path).expect("cut below the acknowledged offset");
        assert_eq!((cut.from, cut.to, cut.unread), (16 << 10, 100 << 10, None));
        // With everything read, the cap holds again.
        write_read(&path, 3 * (64 << 10)).unwrap();
        t.check(true).unwrap();
        let cut = read_cut(&path).unwrap();
        assert_eq!(cut.unread, None);
        assert!(fs::metadata(&path).unwrap().len() - cut.bytes() <= cap.bytes + BLOCK);
    }

    #[test]
    fn an_acknowledgement_in_the_block_already_acknowledged_would_let_nothing_more_be_cut() {
        // Two files, the same stream: one acknowledged at every offset sortie journaled, the
        // other only where `ack_moves` says so; their cutters cut the same bytes each time.
        let dir = tempfile::tempdir().unwrap();
        let cap = Cap { bytes: 64 << 10 };
        let every = dir.path().join("every");
        let moved = dir.path().join("moved");
        let (mut te, mut tm) = {
            fs::write(&every, b"").unwrap();
            fs::write(&moved, b"").unwrap();
            (
                Trimmer::open(&every, cap).unwrap(),
                Trimmer::open(&moved, cap).unwrap(),
            )
        };
        append(&every, 4 * (64 << 10));
        append(&moved, 4 * (64 << 10));
        let mut before = 0;
        for offset in [
            17, 4095, 4096, 30_000, 32_767, 32_768, 100_001, 150_000, 200_000,
        ] {
            write_read(&every, offset).unwrap();
            if ack_moves(before, offset) {
                write_read(&moved, offset).unwrap();
            }
            before = offset;
            te.check(true).unwrap();
            tm.check(true).unwrap();
            assert_eq!(read_cut(&every), read_cut(&moved), "after {offset}");
        }
        assert!(
            read_cut(&moved).is_some(),
            "the acknowledgements let it be cut"
        );
        assert!(!ack_moves(0, BLOCK - 1) && ack_moves(0, BLOCK) && !ack_moves(5000, 8191));
    }

    #[test]
    fn past_its_hard_bound_an_unread_stdout_is_cut_and_the_record_says_what_was_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::layout::attempt::STDOUT_FILE);
        fs::write(&path, b"").unwrap();
        let cap = Cap { bytes: 64 << 10 };
        let mut t = Trimmer::open(&path, cap).unwrap();
        write_read(&path, 40 << 10).unwrap();
        append(&path, 5 * (64 << 10));
        t.check(true).unwrap();
        let len = fs::metadata(&path).unwrap().len();
        let cut = read_cut(&path).expect("cut past the hard bound");
        assert_eq!(
            cut.unread,
            Some(40 << 10),
            "unread from the acknowledged block"
        );
        assert_eq!(cut.unread_bytes(), cut.to - (40 << 10));
        assert!(len - cut.bytes() <= cap.bytes + BLOCK, "back under the cap");
        // The reader jumps it and says what was unread.
        let (_, cuts) = read_all(&path);
        assert_eq!(cuts, vec![cut]);
    }

    #[test]
    fn stderr_is_cut_without_waiting_for_sortie() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::layout::attempt::STDERR_FILE);
        fs::write(&path, b"").unwrap();
        let mut t = Trimmer::open(&path, Cap { bytes: 64 << 10 }).unwrap();
        append(&path, 3 * (64 << 10));
        t.check(true).unwrap();
        assert!(read_cut(&path).is_some_and(|c| c.unread.is_none()));
    }

    #[test]
    fn a_small_transcript_is_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let mut t = Trimmer::create(&path, Cap::default()).unwrap();
        t.write(b"one\ntwo\nthree").unwrap();
        t.check(true).unwrap();
        assert_eq!(read_cut(&path), None);
        assert_eq!(read_all(&path), (b"one\ntwo\nthree".to_vec(), vec![]));
    }

    #[test]
    fn a_reader_from_an_offset_reads_on_from_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        fs::write(&path, b"first\nsecond\n").unwrap();
        let mut r = KeptReader::new(&path, 6);
        let mut buf = [0u8; 64];
        assert_eq!(r.read(&mut buf).unwrap(), Kept::Bytes(7));
        assert_eq!(&buf[..7], b"second\n");
        assert_eq!(r.read(&mut buf).unwrap(), Kept::Idle);
        assert_eq!(r.offset(), 13);
    }
}
