/*
 * gen_config_docs.c — prints the Markdown table of every config key (ct_config_write_docs), the
 * part of configs/README.md that is generated. test_config's readme_matches_key_table fails
 * when the README falls behind the key table in core/config/config_keys.c. Regenerate with:
 *
 *     make && gcc -std=gnu11 -I. test/tools/gen_config_docs.c build/libctcore.a -fopenmp \
 *         -o /tmp/gen_docs -lopenblas -lyaml -ldnnl -lm && /tmp/gen_docs > /tmp/keys.md
 *
 * and replace the table in configs/README.md with /tmp/keys.md.
 */
#include "core/config/config.h"

int main(void) {
    ct_config_write_docs(stdout);
    return 0;
}
