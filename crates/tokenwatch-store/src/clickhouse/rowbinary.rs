// ClickHouse's RowBinary format, both ways: little-endian numbers, LEB128-prefixed strings and
// arrays, a null byte before Nullable values. Exact for NaN and infinities (JSON is not).

/// Appends values of one row after another.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn leb128(&mut self, mut n: u64) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.leb128(v.len() as u64);
        self.buf.extend_from_slice(v);
    }
    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    /// `Nullable(T)`: 1 for NULL, else 0 followed by the value.
    pub fn nullable<T>(&mut self, v: Option<T>, put: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.buf.push(1),
            Some(x) => {
                self.buf.push(0);
                put(self, x);
            }
        }
    }
    pub fn array_u32(&mut self, v: &[u32]) {
        self.leb128(v.len() as u64);
        for x in v {
            self.u32(*x);
        }
    }
    pub fn array_f32(&mut self, v: &[f32]) {
        self.leb128(v.len() as u64);
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// Reads values in column order from a RowBinary answer; errors say what ran short.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "RowBinary answer ends at byte {} while {n} more were expected",
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub fn bool(&mut self) -> Result<bool, String> {
        Ok(self.u8()? != 0)
    }
    pub fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.fixed()?))
    }
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.fixed()?))
    }
    pub fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.fixed()?))
    }
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.fixed()?))
    }
    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.fixed()?))
    }
    pub fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.fixed()?))
    }
    fn leb128(&mut self) -> Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("RowBinary length prefix longer than 10 bytes".into())
    }
    fn len(&mut self, item: usize) -> Result<usize, String> {
        let n = self.leb128()?;
        let n = usize::try_from(n).map_err(|_| format!("RowBinary length {n} too large"))?;
        if n.saturating_mul(item) > self.buf.len() - self.pos {
            return Err(format!(
                "RowBinary length {n} exceeds the {} bytes left",
                self.buf.len() - self.pos
            ));
        }
        Ok(n)
    }
    pub fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let n = self.len(1)?;
        Ok(self.take(n)?.to_vec())
    }
    pub fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?).map_err(|e| format!("string is not UTF-8: {e}"))
    }
    pub fn nullable<T>(
        &mut self,
        get: impl FnOnce(&mut Self) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        match self.u8()? {
            0 => get(self).map(Some),
            1 => Ok(None),
            b => Err(format!("Nullable marker {b}, expected 0 or 1")),
        }
    }
    pub fn array_u32(&mut self) -> Result<Vec<u32>, String> {
        let n = self.len(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    pub fn array_f32(&mut self) -> Result<Vec<f32>, String> {
        let n = self.len(4)?;
        (0..n)
            .map(|_| Ok(f32::from_le_bytes(self.fixed()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let mut w = Writer::default();
        w.u8(7);
        w.u16(513);
        w.i32(-5);
        w.u64(u64::MAX);
        w.i64(i64::MIN);
        w.f64(f64::NAN);
        w.f64(f64::INFINITY);
        w.str(&"x".repeat(300));
        w.nullable(None::<u64>, Writer::u64);
        w.nullable(Some(3u64), Writer::u64);
        w.array_u32(&[1, u32::MAX]);
        w.array_f32(&[0.5, -2.0]);
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u16().unwrap(), 513);
        assert_eq!(r.i32().unwrap(), -5);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.i64().unwrap(), i64::MIN);
        assert!(r.f64().unwrap().is_nan());
        assert_eq!(r.f64().unwrap(), f64::INFINITY);
        assert_eq!(r.string().unwrap(), "x".repeat(300));
        assert_eq!(r.nullable(Reader::u64).unwrap(), None);
        assert_eq!(r.nullable(Reader::u64).unwrap(), Some(3));
        assert_eq!(r.array_u32().unwrap(), [1, u32::MAX]);
        assert_eq!(r.array_f32().unwrap(), [0.5, -2.0]);
        assert!(r.is_empty());
    }

    #[test]
    fn short_or_bad_input_is_an_error() {
        assert!(
            Reader::new(&[1, 2])
                .u32()
                .unwrap_err()
                .contains("ends at byte 2")
        );
        assert!(
            Reader::new(&[200, 1, b'a'])
                .bytes()
                .unwrap_err()
                .contains("exceeds")
        );
        assert!(
            Reader::new(&[2])
                .nullable(Reader::u8)
                .unwrap_err()
                .contains("marker 2")
        );
        assert!(
            Reader::new(&[1, 0xff])
                .string()
                .unwrap_err()
                .contains("UTF-8")
        );
    }
}
