// BF16: the high half of an f32.
const UNIT: u32 = 1u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    let o = base + 2u * u;
    let word = w[o >> 2u];
    let bits = select(word << 16u, word & 0xffff0000u, (o & 2u) != 0u);
    return array<f32, UNIT>(bitcast<f32>(bits));
}
