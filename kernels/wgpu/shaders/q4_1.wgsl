// Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes of nibbles (low: weights 0..15, high: 16..31); w = d * q + m.
const UNIT: u32 = 32u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    let o = base + 20u * u;
    let d = half_at(o);
    let m = half_at(o + 2u);
    var v: array<f32, UNIT>;
    for (var i = 0u; i < 16u; i++) {
        let q = byte_at(o + 4u + i);
        v[i] = d * f32(q & 15u) + m;
        v[i + 16u] = d * f32(q >> 4u) + m;
    }
    return v;
}
