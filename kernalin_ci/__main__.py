from kernalin_ci.cli import main

raise SystemExit(main())
