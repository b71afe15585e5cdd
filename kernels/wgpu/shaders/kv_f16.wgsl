// An f16 KV cache: [capacity, kv_heads, head_dim] f16 bit patterns, two to a u32 word (the CPU cache's bytes).
@group(0) @binding(2) var<storage, read> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;

fn key(e: u32) -> f32 {
    return unpack2x16float(k_cache[e >> 1u])[e & 1u];
}

fn value(e: u32) -> f32 {
    return unpack2x16float(v_cache[e >> 1u])[e & 1u];
}
