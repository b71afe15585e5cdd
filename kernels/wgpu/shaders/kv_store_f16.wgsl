@group(0) @binding(2) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<u32>;

// the pair at even element dst, rounded to f16
fn store(dst: u32, k: vec2<f32>, v: vec2<f32>) {
    k_cache[dst >> 1u] = pack2x16float(k);
    v_cache[dst >> 1u] = pack2x16float(v);
}
