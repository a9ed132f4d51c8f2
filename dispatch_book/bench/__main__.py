from dispatch_book.bench.core import main

main()
