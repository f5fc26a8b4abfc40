//! `DUMP` payloads of lock values, taken apart and put back together, for tests that restore
//! forged or mutated values.
//!
//! A `DUMP` payload is the value in RDB form, then the RDB version (2 bytes, little-endian)
//! and a CRC-64 (Jones polynomial, as in Redis's crc64.c) of everything before it (8 bytes,
//! little-endian). A module value in RDB form is the type byte (7, a module value), the module
//! id (an RDB length: 0x81 and 8 big-endian bytes, whose low 10 bits are the encoding version),
//! then the fields the module wrote, each an opcode (2 for an unsigned, 5 for a string)
//! followed by an RDB length (the number, or the string's length and its bytes), and the end
//! opcode 0.

/// Redis's CRC-64 (Jones polynomial, reflected).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// Replaces the trailing checksum of a `DUMP` payload with the right one.
pub fn reseal(mut payload: Vec<u8>) -> Vec<u8> {
    let body = payload.len().saturating_sub(8);
    let crc = crc64(&payload[..body]);
    payload[body..].copy_from_slice(&crc.to_le_bytes());
    payload
}

/// One field a module wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    Unsigned(u64),
    Bytes(Vec<u8>),
}

/// A module value's `DUMP` payload, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleDump {
    /// The 64-bit module id (type name and encoding version).
    pub module_id: u64,
    pub fields: Vec<Field>,
    /// The RDB version of the trailer.
    pub rdb_version: [u8; 2],
}

fn read_len(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let first = *bytes.get(*at)?;
    *at += 1;
    match first >> 6 {
        0 => Some(u64::from(first & 0x3f)),
        1 => {
            let second = *bytes.get(*at)?;
            *at += 1;
            Some((u64::from(first & 0x3f) << 8) | u64::from(second))
        }
        _ => {
            let n = match first {
                0x80 => 4,
                0x81 => 8,
                _ => return None,
            };
            let b = bytes.get(*at..*at + n)?;
            *at += n;
            Some(b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        }
    }
}

/// LZF decompression, as Redis compresses longer strings in RDB (`rdbcompression yes`).
fn lzf_decompress(input: &[u8], expected: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(expected.min(1 << 20));
    let mut ip = 0;
    while ip < input.len() {
        let ctrl = usize::from(input[ip]);
        ip += 1;
        if ctrl < 32 {
            let run = input.get(ip..ip + ctrl + 1)?;
            out.extend_from_slice(run);
            ip += ctrl + 1;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(*input.get(ip)?);
                ip += 1;
            }
            let back = ((ctrl & 0x1f) << 8) + usize::from(*input.get(ip)?) + 1;
            ip += 1;
            let start = out.len().checked_sub(back)?;
            // Byte by byte: the copy may overlap what it writes (a repeated run).
            for from in start..start + len + 2 {
                let b = out[from];
                out.push(b);
            }
        }
    }
    (out.len() == expected).then_some(out)
}

/// A string field: raw (a length and the bytes), an integer Redis stored as one (0xC0 to
/// 0xC2), or LZF-compressed (0xC3).
fn read_string(bytes: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let first = *bytes.get(*at)?;
    if first >> 6 != 3 {
        let len = usize::try_from(read_len(bytes, at)?).ok()?;
        let b = bytes.get(*at..*at + len)?;
        *at += len;
        return Some(b.to_vec());
    }
    *at += 1;
    let int_bytes = match first & 0x3f {
        0 => 1,
        1 => 2,
        2 => 4,
        3 => {
            let compressed = usize::try_from(read_len(bytes, at)?).ok()?;
            let len = usize::try_from(read_len(bytes, at)?).ok()?;
            let data = bytes.get(*at..*at + compressed)?;
            *at += compressed;
            return lzf_decompress(data, len);
        }
        _ => return None,
    };
    let b = bytes.get(*at..*at + int_bytes)?;
    *at += int_bytes;
    let v = match int_bytes {
        1 => i64::from(b[0] as i8),
        2 => i64::from(i16::from_le_bytes([b[0], b[1]])),
        _ => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    };
    Some(v.to_string().into_bytes())
}

fn write_len(out: &mut Vec<u8>, v: u64) {
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.push(0x40 | (v >> 8) as u8);
        out.push(v as u8);
    } else if v <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

impl ModuleDump {
    /// Takes apart a payload `DUMP` returned for a module value; `None` if it is not one.
    pub fn parse(payload: &[u8]) -> Option<ModuleDump> {
        let body_end = payload.len().checked_sub(10)?;
        let body = &payload[..body_end];
        if body.first() != Some(&7) || body.get(1) != Some(&0x81) {
            return None;
        }
        let mut at = 1;
        let module_id = read_len(body, &mut at)?;
        let mut fields = Vec::new();
        loop {
            let opcode = read_len(body, &mut at)?;
            match opcode {
                0 => break,
                2 => fields.push(Field::Unsigned(read_len(body, &mut at)?)),
                5 => fields.push(Field::Bytes(read_string(body, &mut at)?)),
                _ => return None,
            }
        }
        (at == body.len()).then_some(ModuleDump {
            module_id,
            fields,
            rdb_version: [payload[body_end], payload[body_end + 1]],
        })
    }

    /// The encoding version in the module id.
    pub fn encoding_version(&self) -> u64 {
        self.module_id & 0x3ff
    }

    /// The payload again, with a correct checksum (strings written raw, as Redis accepts
    /// them too).
    pub fn payload(&self) -> Vec<u8> {
        let mut out = vec![7];
        write_len(&mut out, self.module_id);
        for f in &self.fields {
            match f {
                Field::Unsigned(v) => {
                    out.push(2);
                    write_len(&mut out, *v);
                }
                Field::Bytes(b) => {
                    out.push(5);
                    write_len(&mut out, b.len() as u64);
                    out.extend_from_slice(b);
                }
            }
        }
        out.push(0);
        out.extend_from_slice(&self.rdb_version);
        out.extend_from_slice(&[0; 8]);
        reseal(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_check_value() {
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn lengths_round_trip() {
        for v in [
            0,
            63,
            64,
            16383,
            16384,
            u64::from(u32::MAX),
            1 << 32,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            write_len(&mut out, v);
            let mut at = 0;
            assert_eq!(read_len(&out, &mut at), Some(v));
            assert_eq!(at, out.len());
        }
    }
}
