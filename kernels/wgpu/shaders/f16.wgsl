// F16: one weight per unit (rows of odd length start at half-word offsets).
const UNIT: u32 = 1u;

fn unit_values(base: u32, u: u32) -> array<f32, UNIT> {
    return array<f32, UNIT>(half_at(base + 2u * u));
}
