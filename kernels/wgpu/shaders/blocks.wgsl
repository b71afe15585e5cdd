// Readers of GGUF block bytes from the u32 words of a storage buffer `w` (little-endian, as GGUF stores them).

const WG: u32 = 64u;

fn byte_at(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

fn sbyte_at(o: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(o) << 24u) >> 24u);
}

// the f16 at an even byte offset
fn half_at(o: u32) -> f32 {
    let word = w[o >> 2u];
    return unpack2x16float(select(word & 0xffffu, word >> 16u, (o & 2u) != 0u)).x;
}
