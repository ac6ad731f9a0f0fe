/* cblas_sgemm for MLX, served by OpenBLAS from the scipy-openblas32 wheel.
 *
 * MLX's Linux CPU wheel calls cblas_sgemm for every float32 matmul and binds the
 * symbol through the dynamic linker (mlxinfer/cpu/blas.py loads this library globally
 * before mlx). scipy-openblas32 exports its functions as scipy_cblas_*, so this
 * file gives MLX the name it looks for. One case is routed elsewhere: a single-row
 * product (M == 1, every decode step) goes to sgemv, which OpenBLAS runs at full
 * memory speed, while its sgemm takes the general path and reads the weights
 * 2-3x slower (measured on the embedded model's 49152 x 576 output table).
 * Built by `python -m mlxinfer.cpu.openblas_shim`.
 */
enum { RowMajor = 101, NoTrans = 111, Trans = 112 };

void scipy_cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
void scipy_cblas_sgemv(int order, int trans, int rows, int cols, float alpha, const float *A, int lda,
                       const float *x, int incx, float beta, float *y, int incy);

void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
  if (order == RowMajor && M == 1 && N > 0 && K > 0) {
    /* C (1 x N) = op(A) (1 x K) . op(B) (K x N). With tb == Trans, B is stored N x K and
       C = B . a; otherwise B is stored K x N and C = B^T . a. The K entries of a are
       contiguous unless A is transposed (stored K x 1, stride lda). */
    int rows = tb == Trans ? N : K, cols = tb == Trans ? K : N;
    scipy_cblas_sgemv(RowMajor, tb == Trans ? NoTrans : Trans, rows, cols, alpha, B, ldb, A,
                      ta == Trans ? lda : 1, beta, C, 1);
    return;
  }
  scipy_cblas_sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
