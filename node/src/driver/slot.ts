/**
 * Redis Cluster's key slot: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384.
 * @internal
 */

const TABLE: Uint16Array = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let b = 0; b < 8; b++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    t[i] = crc;
  }
  return t;
})();

/** CRC16/XMODEM of `bytes`. */
export function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ (TABLE[((crc >> 8) ^ byte) & 0xff] ?? 0);
  return crc;
}

/** The cluster slot of `key` (utf8), honouring `{hash tags}`. */
export function slotOf(key: string | Buffer): number {
  let bytes: Buffer = typeof key === "string" ? Buffer.from(key, "utf8") : key;
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  return crc16(bytes) % 16384;
}
