"""One check per exercise: it takes the exercise's module and raises AssertionError on a wrong
answer. The expected values are computed independently (plain loops or textbook formulas), never
by the solutions. Random inputs are seeded; shapes include the edge cases (no rows, sizes that are
not multiples of the tiles, ties), and every check rejects the wrong solutions of
``exercises/wrong/``: the mistakes its chapter warns about. The checks live by chapter in
``exercises/_check/``."""
from exercises._check.ch00 import ch00_crossover, ch00_route_v3
from exercises._check.ch01 import ch01_offsets, ch01_top1
from exercises._check.ch02 import ch02_combine, ch02_gather_rows, ch02_tile
from exercises._check.ch03 import ch03_experts_touched, ch03_gemv, ch03_round_robin
from exercises._check.ch04 import ch04_all_to_all, ch04_capacity, ch04_home_rows, ch04_send_plan
from exercises._check.ch05 import ch05_aux_loss, ch05_bias_controller
from exercises._check.ch06 import ch06_bucket, ch06_kv_cache, ch06_sampling
from exercises._check.ch07 import ch07_e4m3_bits, ch07_quantize
from exercises._check.ch08 import ch08_block_allocator, ch08_scheduler_step
from exercises._check.ch09 import ch09_accept, ch09_ngram
from exercises._check.ch10 import ch10_handoff_plan, ch10_ttft

__all__ = ["ch00_route_v3", "ch00_crossover", "ch01_offsets", "ch01_top1", "ch02_gather_rows", "ch02_tile",
           "ch02_combine", "ch03_gemv", "ch03_experts_touched", "ch03_round_robin", "ch04_send_plan",
           "ch04_home_rows", "ch04_capacity", "ch04_all_to_all", "ch05_aux_loss", "ch05_bias_controller",
           "ch06_kv_cache", "ch06_bucket", "ch06_sampling", "ch07_quantize", "ch07_e4m3_bits",
           "ch08_block_allocator", "ch08_scheduler_step", "ch09_ngram", "ch09_accept",
           "ch10_handoff_plan", "ch10_ttft"]
