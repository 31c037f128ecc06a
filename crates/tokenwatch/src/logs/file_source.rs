// Tailing one log file: reads complete lines from where it left off, follows rotation (a new
// inode at the path: the old file is read to its end first) and truncation (back to the start).

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Bytes read per poll at most, so one huge backlog cannot starve the other sources.
const MAX_READ_PER_POLL: u64 = 8 * 1024 * 1024;
/// A line longer than this is cut (the rest up to its newline is skipped).
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// Where a file was read up to: the byte after the last complete line handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileOffset {
    pub inode: u64,
    pub offset: u64,
}

#[cfg(unix)]
fn inode_of(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.ino()
}

#[cfg(not(unix))]
fn inode_of(_meta: &std::fs::Metadata) -> u64 {
    0
}

pub struct Tailer {
    path: PathBuf,
    file: Option<File>,
    inode: u64,
    /// Offset of the first byte not yet handed out in a complete line.
    offset: u64,
    /// Bytes read past `offset` that do not end in a newline yet.
    partial: Vec<u8>,
    /// Skipping the rest of a line that was cut at `MAX_LINE_BYTES`.
    skipping: bool,
    /// Saved position to resume from at the first open.
    resume: Option<FileOffset>,
}

impl Tailer {
    pub fn new(path: &Path, resume: Option<FileOffset>) -> Tailer {
        Tailer {
            path: path.to_path_buf(),
            file: None,
            inode: 0,
            offset: 0,
            partial: Vec::new(),
            skipping: false,
            resume,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The position to persist (None before the file was first opened: the saved one stands).
    pub fn position(&self) -> Option<FileOffset> {
        match (&self.file, self.resume) {
            (Some(_), _) => Some(FileOffset {
                inode: self.inode,
                offset: self.offset,
            }),
            (None, r) => r,
        }
    }

    /// Hand every complete line now in the file to `line`. A missing file is not an error
    /// (it may be rotated or not created yet); other I/O errors are returned.
    pub fn poll(&mut self, line: &mut dyn FnMut(&str)) -> std::io::Result<()> {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let Some(meta) = meta else {
            // Renamed away and not recreated yet: finish what the old file still holds.
            if self.file.is_some() {
                self.read_available(line)?;
            }
            return Ok(());
        };
        let inode = inode_of(&meta);
        if self.file.is_some() && inode != self.inode {
            // Rotated: the old file's last lines first, then the new file from its start.
            self.read_available(line)?;
            self.flush_partial(line);
            self.open(inode, 0)?;
        } else if self.file.is_none() {
            let start = match self.resume.take() {
                Some(r) if r.inode == inode && r.offset <= meta.len() => r.offset,
                _ => 0,
            };
            self.open(inode, start)?;
        } else if meta.len() < self.offset + self.partial.len() as u64 {
            // Truncated in place (copytruncate): start over.
            self.open(inode, 0)?;
        }
        self.read_available(line)
    }

    fn open(&mut self, inode: u64, offset: u64) -> std::io::Result<()> {
        let mut f = File::open(&self.path)?;
        f.seek(SeekFrom::Start(offset))?;
        self.file = Some(f);
        self.inode = inode;
        self.offset = offset;
        self.partial.clear();
        self.skipping = false;
        Ok(())
    }

    /// A rotated file's last line without a newline is still a line.
    fn flush_partial(&mut self, line: &mut dyn FnMut(&str)) {
        if !self.partial.is_empty() && !self.skipping {
            emit(&self.partial, line);
        }
        self.partial.clear();
    }

    fn read_available(&mut self, line: &mut dyn FnMut(&str)) -> std::io::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut read_total = 0u64;
        while read_total < MAX_READ_PER_POLL {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            read_total += n as u64;
            let mut start = 0;
            for (i, b) in buf[..n].iter().enumerate() {
                if *b != b'\n' {
                    continue;
                }
                let piece = &buf[start..i];
                if self.skipping {
                    self.offset += piece.len() as u64 + 1;
                } else {
                    let consumed = if self.partial.is_empty() {
                        emit(piece, line);
                        piece.len()
                    } else {
                        self.partial.extend_from_slice(piece);
                        emit(&self.partial, line);
                        self.partial.len()
                    };
                    self.offset += consumed as u64 + 1;
                }
                self.partial.clear();
                self.skipping = false;
                start = i + 1;
            }
            let rest = &buf[start..n];
            if self.skipping {
                self.offset += rest.len() as u64;
            } else {
                self.partial.extend_from_slice(rest);
                if self.partial.len() > MAX_LINE_BYTES {
                    emit(&self.partial[..MAX_LINE_BYTES], line);
                    self.offset += self.partial.len() as u64;
                    self.partial.clear();
                    self.skipping = true;
                }
            }
        }
        Ok(())
    }
}

fn emit(bytes: &[u8], line: &mut dyn FnMut(&str)) {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let bytes = &bytes[..bytes.len().min(MAX_LINE_BYTES)];
    let text = String::from_utf8_lossy(bytes);
    if !text.trim().is_empty() {
        line(&text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn poll(t: &mut Tailer) -> Vec<String> {
        let mut out = Vec::new();
        t.poll(&mut |l| out.push(l.to_string())).unwrap();
        out
    }

    fn append(p: &Path, s: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap();
        f.write_all(s.as_bytes()).unwrap();
    }

    #[test]
    fn reads_complete_lines_and_resumes_from_the_saved_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vllm.log");
        let mut t = Tailer::new(&p, None);
        assert!(poll(&mut t).is_empty(), "a missing file is no error");
        assert_eq!(t.position(), None);
        append(&p, "one\ntwo\r\nthr");
        assert_eq!(poll(&mut t), ["one", "two"]);
        let pos = t.position().unwrap();
        assert_eq!(pos.offset, 9, "the partial line is not consumed");
        append(&p, "ee\n\nfour\n");
        assert_eq!(poll(&mut t), ["three", "four"]);
        let saved = t.position().unwrap();
        assert_eq!(saved.offset, std::fs::metadata(&p).unwrap().len());
        append(&p, "five\n");
        // A restart resumes where the last one stopped: nothing read twice.
        let mut again = Tailer::new(&p, Some(saved));
        assert_eq!(again.position(), Some(saved));
        assert_eq!(poll(&mut again), ["five"]);
        // A saved position from another file (other inode) starts at the beginning.
        let other = FileOffset {
            inode: saved.inode.wrapping_add(1),
            offset: 3,
        };
        let mut fresh = Tailer::new(&p, Some(other));
        assert_eq!(poll(&mut fresh), ["one", "two", "three", "four", "five"]);
    }

    #[test]
    fn follows_rename_rotation_reading_the_old_file_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vllm.log");
        append(&p, "a1\n");
        let mut t = Tailer::new(&p, None);
        assert_eq!(poll(&mut t), ["a1"]);
        append(&p, "a2\na3");
        std::fs::rename(&p, dir.path().join("vllm.log.1")).unwrap();
        // Between the rename and the new file: the old file's rest.
        assert_eq!(poll(&mut t), ["a2"]);
        append(&p, "b1\nb2\n");
        assert_eq!(poll(&mut t), ["a3", "b1", "b2"]);
        assert_eq!(t.position().unwrap().offset, 6);
        assert_eq!(
            t.position().unwrap().inode,
            inode_of(&std::fs::metadata(&p).unwrap())
        );
    }

    #[test]
    fn truncation_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vllm.log");
        append(&p, "first line\nsecond line\n");
        let mut t = Tailer::new(&p, None);
        assert_eq!(poll(&mut t).len(), 2);
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        append(&p, "new\n");
        assert_eq!(poll(&mut t), ["new"]);
        assert_eq!(t.position().unwrap().offset, 4);
        // Truncated while stopped: the saved offset lies past the end, so from the start.
        let saved = FileOffset {
            inode: t.position().unwrap().inode,
            offset: 999,
        };
        let mut r = Tailer::new(&p, Some(saved));
        assert_eq!(poll(&mut r), ["new"]);
    }

    #[test]
    fn overlong_lines_are_cut_and_the_rest_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.log");
        append(&p, &format!("{}\nafter\n", "x".repeat(MAX_LINE_BYTES * 5)));
        let mut t = Tailer::new(&p, None);
        let lines = poll(&mut t);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), MAX_LINE_BYTES);
        assert_eq!(lines[1], "after");
        assert_eq!(
            t.position().unwrap().offset,
            std::fs::metadata(&p).unwrap().len()
        );
    }
}
